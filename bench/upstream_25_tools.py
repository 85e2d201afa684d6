"""Benchmark upstream: a real MCP server (official SDK, ``mcp`` 2.x) with 25 realistic tools.

Usage: python bench/upstream_25_tools.py PORT   -> http://127.0.0.1:PORT/mcp

An "engineering workspace" server (issues, pull requests, CI, deploys, incidents, docs), so
that ``tools/list`` has the size and shape of a real one: 25 tools with described, typed
parameters, about 18 KB of JSON. Every cacheable method is marked ``cacheScope:"public"`` with
``ttlMs`` = $UPSTREAM_TTL_MS (default 3600000, longer than any benchmark run).

The SDK app is wrapped in a small ASGI counter (like tests/servers/_common.py) that counts the
JSON-RPC methods POSTed to ``/mcp``: ``GET /_counts`` -> ``{"tools/list": 3, ...}``,
``POST /_counts/reset`` clears them. The cold-burst figure is read from it.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Annotated, Any, Literal

from mcp.server import MCPServer
from mcp.server.caching import CacheHint
from pydantic import Field

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

HOST = "127.0.0.1"
CACHEABLE = (
    "server/discover",
    "tools/list",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
)

Repo = Annotated[str, Field(description="Repository in `owner/name` form, e.g. `acme/payments-api`.")]
IssueNumber = Annotated[int, Field(ge=1, description="Issue or pull request number within the repository.")]
Limit = Annotated[int, Field(ge=1, le=100, description="Maximum number of items to return (1-100).")]
Cursor = Annotated[str | None, Field(description="Opaque pagination cursor from a previous call's `next_cursor`.")]
Environment = Annotated[
    Literal["development", "staging", "production"], Field(description="Deployment environment to act on.")
]


def build_server(ttl_ms: int) -> MCPServer[Any]:
    hint = CacheHint(ttl_ms=ttl_ms, scope="public")
    srv: MCPServer[Any] = MCPServer(
        "bench-workspace",
        version="3.1.0",
        instructions=(
            "Engineering workspace tools: search and edit issues, review pull requests, inspect CI runs, "
            "deploy services, and manage incidents. Prefer read-only tools before mutating ones."
        ),
        cache_hints={m: hint for m in CACHEABLE},  # type: ignore[misc]
    )

    # -- issues ---------------------------------------------------------------------------
    @srv.tool()
    def search_issues(
        query: Annotated[str, Field(description="Full-text query; supports `label:`, `author:` and `is:open`.")],
        repo: Annotated[str | None, Field(description="Restrict the search to one `owner/name` repository.")] = None,
        state: Annotated[Literal["open", "closed", "all"], Field(description="Issue state filter.")] = "open",
        limit: Limit = 20,
    ) -> str:
        """Search issues across the workspace's repositories and return matching titles, numbers and labels."""
        return f"0 issues match {query!r}"

    @srv.tool()
    def get_issue(repo: Repo, number: IssueNumber) -> str:
        """Fetch one issue with its title, body, labels, assignees, milestone and the last 20 comments."""
        return json.dumps({"repo": repo, "number": number, "title": "Checkout fails on retry", "state": "open"})

    @srv.tool()
    def create_issue(
        repo: Repo,
        title: Annotated[str, Field(min_length=1, max_length=256, description="Short summary of the problem.")],
        body: Annotated[str, Field(description="Markdown description: steps to reproduce, expected, actual.")] = "",
        labels: Annotated[list[str], Field(description="Label names to apply; unknown labels are created.")] = [],  # noqa: B006
    ) -> str:
        """Open a new issue in a repository. Returns the new issue's number and URL."""
        return f"created {repo}#1: {title}"

    @srv.tool()
    def update_issue(
        repo: Repo,
        number: IssueNumber,
        title: Annotated[str | None, Field(description="New title; omit to keep the current one.")] = None,
        state: Annotated[Literal["open", "closed"] | None, Field(description="Close or reopen the issue.")] = None,
    ) -> str:
        """Edit an issue's title, state or labels. Only the fields given are changed."""
        return f"updated {repo}#{number}"

    @srv.tool()
    def add_issue_comment(
        repo: Repo,
        number: IssueNumber,
        body: Annotated[str, Field(min_length=1, description="Comment text in Markdown.")],
    ) -> str:
        """Add a comment to an issue or pull request conversation."""
        return f"commented on {repo}#{number}"

    @srv.tool()
    def list_labels(repo: Repo, limit: Limit = 50) -> str:
        """List the labels defined in a repository with their colors and descriptions."""
        return "bug, enhancement, documentation"

    # -- code and pull requests -------------------------------------------------------------
    @srv.tool()
    def list_repositories(
        owner: Annotated[str, Field(description="Organisation or user that owns the repositories.")],
        visibility: Annotated[Literal["all", "public", "private"], Field(description="Visibility filter.")] = "all",
        limit: Limit = 30,
    ) -> str:
        """List repositories of an organisation or user, most recently updated first."""
        return f"{owner}/payments-api, {owner}/web"

    @srv.tool()
    def get_file_contents(
        repo: Repo,
        path: Annotated[str, Field(description="Path of the file inside the repository, e.g. `src/app.py`.")],
        ref: Annotated[str | None, Field(description="Branch, tag or commit SHA; default branch if omitted.")] = None,
    ) -> str:
        """Read a file from a repository at a given ref. Binary files are returned base64-encoded."""
        return f"# {path}\n"

    @srv.tool()
    def search_code(
        query: Annotated[str, Field(description="Code search query; supports `lang:`, `path:` and `repo:`.")],
        limit: Limit = 20,
        cursor: Cursor = None,
    ) -> str:
        """Search source code across repositories and return file paths with matching line fragments."""
        return "no matches"

    @srv.tool()
    def list_pull_requests(
        repo: Repo,
        state: Annotated[Literal["open", "closed", "merged", "all"], Field(description="State filter.")] = "open",
        limit: Limit = 20,
    ) -> str:
        """List pull requests of a repository with their authors, review state and CI status."""
        return "#12 Add retry budget (open, approved)"

    @srv.tool()
    def get_pull_request(repo: Repo, number: IssueNumber) -> str:
        """Fetch a pull request: description, changed files summary, reviews, checks and mergeability."""
        return f"{repo}#{number}: mergeable"

    @srv.tool()
    def get_pull_request_diff(
        repo: Repo,
        number: IssueNumber,
        context_lines: Annotated[int, Field(ge=0, le=20, description="Unchanged lines around each hunk.")] = 3,
    ) -> str:
        """Return the unified diff of a pull request, truncated at 200 KB."""
        return "diff --git a/x b/x"

    @srv.tool()
    def create_review(
        repo: Repo,
        number: IssueNumber,
        event: Annotated[Literal["APPROVE", "REQUEST_CHANGES", "COMMENT"], Field(description="The review's verdict.")],
        body: Annotated[str, Field(description="Review summary in Markdown.")] = "",
    ) -> str:
        """Submit a review on a pull request: approve, request changes, or comment."""
        return f"review {event} on {repo}#{number}"

    @srv.tool()
    def merge_pull_request(
        repo: Repo,
        number: IssueNumber,
        method: Annotated[Literal["merge", "squash", "rebase"], Field(description="Merge strategy.")] = "squash",
    ) -> str:
        """Merge a pull request once its required checks and reviews pass."""
        return f"merged {repo}#{number} ({method})"

    # -- CI and deploys -----------------------------------------------------------------------
    @srv.tool()
    def list_workflow_runs(
        repo: Repo,
        branch: Annotated[str | None, Field(description="Only runs for this branch.")] = None,
        status: Annotated[
            Literal["queued", "in_progress", "success", "failure", "cancelled"] | None,
            Field(description="Only runs in this status."),
        ] = None,
        limit: Limit = 20,
    ) -> str:
        """List recent CI workflow runs with their status, duration and triggering commit."""
        return "run 981: success in 4m12s"

    @srv.tool()
    def get_workflow_run_logs(
        repo: Repo,
        run_id: Annotated[int, Field(ge=1, description="Workflow run identifier.")],
    ) -> str:
        """Fetch the logs of a workflow run (or one of its jobs), newest lines last."""
        return "step 3/5: tests passed"

    @srv.tool()
    def rerun_workflow(
        repo: Repo,
        run_id: Annotated[int, Field(ge=1, description="Workflow run identifier.")],
        failed_only: Annotated[bool, Field(description="Rerun only the jobs that failed.")] = True,
    ) -> str:
        """Re-run a workflow run, or only its failed jobs."""
        return f"rerun of {run_id} queued"

    @srv.tool()
    def list_deployments(
        service: Annotated[str, Field(description="Service name as registered in the deploy catalogue.")],
        environment: Environment = "production",
        limit: Limit = 10,
    ) -> str:
        """List recent deployments of a service to an environment, with versions and who deployed them."""
        return f"{service}@2024.11.3 in {environment}"

    @srv.tool()
    def deploy_service(
        service: Annotated[str, Field(description="Service name as registered in the deploy catalogue.")],
        version: Annotated[str, Field(description="Version or image tag to deploy, e.g. `2024.11.3`.")],
        environment: Environment,
        canary_percent: Annotated[
            int, Field(ge=0, le=100, description="Share of traffic for the canary; 100 deploys at once.")
        ] = 10,
    ) -> str:
        """Start a deployment of a service version to an environment, optionally as a canary."""
        return f"deploying {service}@{version} to {environment}"

    @srv.tool()
    def rollback_deployment(
        service: Annotated[str, Field(description="Service name as registered in the deploy catalogue.")],
        environment: Environment,
        reason: Annotated[str, Field(min_length=3, description="Why the rollback is needed (audit log).")],
    ) -> str:
        """Roll a service back to its previous healthy version in an environment."""
        return f"rolled back {service} in {environment}"

    # -- operations ----------------------------------------------------------------------------
    @srv.tool()
    def query_metrics(
        expression: Annotated[str, Field(description="PromQL expression to evaluate.")],
        range_minutes: Annotated[int, Field(ge=1, le=10080, description="Look-back window in minutes.")] = 60,
    ) -> str:
        """Evaluate a PromQL expression over a time range and return the series as CSV."""
        return "timestamp,value\n"

    @srv.tool()
    def search_logs(
        query: Annotated[str, Field(description="Log query, e.g. `service:checkout level:error timeout`.")],
        limit: Limit = 50,
    ) -> str:
        """Search structured application logs and return matching lines, newest first."""
        return "no log lines"

    @srv.tool()
    def list_incidents(
        status: Annotated[
            Literal["triggered", "acknowledged", "resolved", "all"], Field(description="Incident status filter.")
        ] = "triggered",
        service: Annotated[str | None, Field(description="Only incidents affecting this service.")] = None,
        limit: Limit = 20,
    ) -> str:
        """List incidents with their severity, affected services and current responder."""
        return "INC-42 (sev2, checkout) acknowledged"

    @srv.tool()
    def acknowledge_incident(
        incident_id: Annotated[str, Field(pattern=r"^INC-\d+$", description="Incident identifier, e.g. `INC-42`.")],
        note: Annotated[str | None, Field(description="Optional note for the incident timeline.")] = None,
    ) -> str:
        """Acknowledge an incident so that escalation stops; the note is added to its timeline."""
        return f"{incident_id} acknowledged"

    @srv.tool()
    def search_docs(
        query: Annotated[str, Field(description="Natural-language question or keywords.")],
        limit: Limit = 5,
    ) -> str:
        """Search internal documentation and runbooks; returns titles, URLs and matching excerpts."""
        return "Runbook: checkout latency"

    return srv


class MethodCounter:
    """ASGI middleware: count the JSON-RPC methods POSTed to ``/mcp``; serve ``/_counts``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.counts: Counter[str] = Counter()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] in ("/_counts", "/_counts/reset"):
            if scope["path"] == "/_counts/reset":
                self.counts.clear()
            data = json.dumps(dict(self.counts)).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
                }
            )
            await send({"type": "http.response.body", "body": data})
            return
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            method = json.loads(body).get("method", "<response>")
        except (ValueError, AttributeError):
            method = "<invalid>"
        self.counts[str(method)] += 1
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def main() -> None:
    import uvicorn

    if len(sys.argv) != 2:
        raise SystemExit(f"usage: {sys.argv[0]} PORT")
    srv = build_server(int(os.environ.get("UPSTREAM_TTL_MS", "3600000")))
    app = MethodCounter(srv.streamable_http_app(streamable_http_path="/mcp", host=HOST))
    uvicorn.run(
        app,
        host=HOST,
        port=int(sys.argv[1]),
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=1,
    )


if __name__ == "__main__":
    main()
