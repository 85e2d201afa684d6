"""Offline schema validation of the Kubernetes manifests in deploy/kubernetes.

Run with the tools venv's Python (see requirements.txt) by
scripts/check-deploy.sh:

    python validate_manifests.py [--node-modules DIR] [-k 1.29.0 ...] DIR

* Built-in kinds: kubernetes-validate in strict mode (unknown fields are
  errors) against the JSON schemas bundled in its wheel, for every -k version.
* Prometheus Operator CRDs (monitoring.coreos.com): validate-crds.mjs with the
  schemas bundled in @kubernetes-models/prometheus-operator (needs
  --node-modules; without it they are reported as errors).
* kustomization.yaml: checked for consistency with the files in DIR (there is
  no offline kustomize here to build it).

Exits 1 if anything fails. Prints one line per checked document.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

import yaml
from kubernetes_validate import utils as kv

DEFAULT_VERSIONS = ["1.29.0", "1.37.0"]
CRD_GROUPS = ("monitoring.coreos.com/",)
KUSTOMIZE_API = "kustomize.config.k8s.io/"


def load_docs(path: pathlib.Path) -> list[dict]:
    with path.open() as fh:
        return [d for d in yaml.safe_load_all(fh) if d]


def name_of(doc: dict) -> str:
    return f"{str(doc.get('kind', '?')).lower()}/{doc.get('metadata', {}).get('name', '?')}"


def check_kustomization(path: pathlib.Path, doc: dict, all_docs: dict) -> list[str]:
    errors = []
    base = path.parent
    listed = doc.get("resources") or []
    for res in listed:
        if not (base / res).is_file():
            errors.append(f"{path.name}: resource {res} does not exist")
    expected = {
        p.name
        for p in base.glob("*.yaml")
        if p.name != path.name and not p.name.endswith(".example.yaml")
    }
    for missing in sorted(expected - set(listed)):
        errors.append(f"{path.name}: {missing} is not listed in resources")
    images = set()
    for docs in all_docs.values():
        for d in docs:
            spec = d.get("spec", {}).get("template", {}).get("spec", {})
            for c in spec.get("containers", []) + spec.get("initContainers", []):
                images.add(c["image"].split("@")[0].rsplit(":", 1)[0])
    for img in doc.get("images") or []:
        if img.get("name") not in images:
            errors.append(f"{path.name}: images entry {img.get('name')!r} matches no container image")
    return errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("directory", type=pathlib.Path)
    ap.add_argument("-k", "--kubernetes-version", action="append", dest="versions")
    ap.add_argument("--node-modules", type=pathlib.Path,
                    help="node_modules with @kubernetes-models/prometheus-operator")
    args = ap.parse_args()
    versions = args.versions or DEFAULT_VERSIONS

    files = sorted(args.directory.glob("*.yaml")) + sorted(args.directory.glob("*.yml"))
    if not files:
        print(f"ERROR no manifests in {args.directory}")
        return 1
    all_docs: dict[str, list[dict]] = {}
    failures = 0
    for f in files:
        try:
            all_docs[f.name] = load_docs(f)
        except yaml.YAMLError as exc:
            print(f"ERROR {f.name}: YAML does not parse: {exc}")
            failures += 1

    crd_items = []
    for fname, docs in all_docs.items():
        path = args.directory / fname
        for doc in docs:
            api = str(doc.get("apiVersion", ""))
            if api.startswith(KUSTOMIZE_API):
                errs = check_kustomization(path, doc, all_docs)
                for e in errs:
                    print(f"ERROR {e}")
                failures += len(errs)
                if not errs:
                    print(f"OK    {fname}: kustomization consistent with {args.directory}")
                continue
            if api.startswith(CRD_GROUPS):
                crd_items.append({"file": fname, "doc": doc})
                continue
            for version in versions:
                try:
                    got = kv.validate(doc, version, strict=True)
                    print(f"OK    {fname}: {name_of(doc)} ({api}, Kubernetes {got}, strict)")
                except kv.ValidationError as exc:
                    where = ".".join(str(p) for p in exc.path)
                    print(f"ERROR {fname}: {name_of(doc)} (Kubernetes {exc.version}): {where}: {exc.message}")
                    failures += 1
                except (kv.SchemaNotFoundError, kv.InvalidSchemaError, kv.VersionNotSupportedError) as exc:
                    print(f"ERROR {fname}: {name_of(doc)}: {exc.message}")
                    failures += 1

    if crd_items:
        if args.node_modules is None:
            for item in crd_items:
                print(f"ERROR {item['file']}: {name_of(item['doc'])}: no --node-modules for CRD schemas")
            failures += len(crd_items)
        else:
            script = pathlib.Path(__file__).with_name("validate-crds.mjs")
            proc = subprocess.run(
                ["node", str(script), str(args.node_modules)],
                input=json.dumps(crd_items), text=True, capture_output=True,
            )
            sys.stdout.write(proc.stdout)
            sys.stderr.write(proc.stderr)
            if proc.returncode != 0:
                failures += 1

    print(f"manifests: {'FAILED' if failures else 'ok'} ({failures} error(s))")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
