// A real OpenID provider for the sign-in tests: panva's oidc-provider
// (installed pinned into target/oidc-provider by the tests), on 127.0.0.1,
// with one confidential client, a `groups` claim, its development login
// form (any password) and signing keys from the environment, so a test
// can restart it with a new key (rotation). It issues refresh tokens to
// the client and sends back-channel logouts (Back-Channel Logout 1.0) to
// the CA when a person signs out at `/session/end`.
//
// `POST /_test/groups` with `{"user": NAME, "groups": [..] | null}`
// changes a person's groups, or removes the person (null): what an
// administrator of the provider does. `GET /_test/last-logout` answers
// the body of the last back-channel logout sent (to replay it).
//
// Environment: OP_MODULE (path of oidc-provider's package directory),
// OP_PORT (0: any), OP_REDIRECT (the CA's callback URL), OP_SECRET (the
// client secret), OP_KID (the signing key's id), OP_GROUPS (JSON: user →
// groups), OP_BACKCHANNEL (the CA's back-channel logout URL) and
// OP_CA_FILE (the CA's root, read when a logout is sent: the CA writes it
// after the provider starts). Prints `READY <port>` once it listens.
import http from 'node:http';
import https from 'node:https';
import fs from 'node:fs';
import crypto from 'node:crypto';
import { pathToFileURL } from 'node:url';
import path from 'node:path';

const { default: Provider } = await import(
  pathToFileURL(path.join(process.env.OP_MODULE, 'lib', 'index.js')).href
);

const groups = JSON.parse(process.env.OP_GROUPS || '{}');
let lastLogout = '';
const { privateKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
const jwk = { ...privateKey.export({ format: 'jwk' }), kid: process.env.OP_KID || 'k1', alg: 'RS256', use: 'sig' };

const server = http.createServer();
await new Promise((resolve) => server.listen(Number(process.env.OP_PORT || 0), '127.0.0.1', resolve));
const port = server.address().port;

const provider = new Provider(`http://127.0.0.1:${port}`, {
  clients: [{
    client_id: 'reach',
    client_secret: process.env.OP_SECRET,
    redirect_uris: [process.env.OP_REDIRECT],
    grant_types: ['authorization_code', 'refresh_token'],
    response_types: ['code'],
    ...(process.env.OP_BACKCHANNEL ? {
      backchannel_logout_uri: process.env.OP_BACKCHANNEL,
      backchannel_logout_session_required: true,
    } : {}),
  }],
  features: { backchannelLogout: { enabled: true } },
  issueRefreshToken: async (ctx, client) => client.grantTypeAllowed('refresh_token'),
  // Outgoing requests (the back-channel logout) trust the CA's root.
  fetch: (url, options) => new Promise((resolve, reject) => {
    const target = new URL(url);
    const send = target.protocol === 'https:' ? https : http;
    const ca = process.env.OP_CA_FILE ? fs.readFileSync(process.env.OP_CA_FILE) : undefined;
    const req = send.request(target, {
      method: options.method,
      headers: Object.fromEntries(new Headers(options.headers)),
      ca,
    }, (res) => {
      res.resume();
      res.on('end', () => resolve({ status: res.statusCode }));
    });
    req.on('error', reject);
    lastLogout = String(options.body ?? '');
    req.end(lastLogout);
  }),
  jwks: { keys: [jwk] },
  claims: { openid: ['sub'], profile: ['name', 'preferred_username'], groups: ['groups'] },
  scopes: ['openid', 'profile', 'groups'],
  conformIdTokenClaims: false,
  cookies: { keys: ['test-cookie-key-0123456789'] },
  // A person removed (not in `groups`) has no account: refresh tokens
  // and userinfo are refused.
  findAccount: async (ctx, id) => (Object.hasOwn(groups, id) ? {
    accountId: id,
    claims: async () => ({ sub: id, name: id, preferred_username: id, groups: groups[id] || [] }),
  } : undefined),
  // Consent is given: the login form is the only page.
  loadExistingGrant: async (ctx) => {
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId,
      accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope('openid profile groups');
    await grant.save();
    return grant;
  },
});
provider.proxy = false;
const callback = provider.callback();
server.on('request', (req, res) => {
  if (req.method === 'POST' && req.url === '/_test/groups') {
    let body = '';
    req.on('data', (c) => { body += c; });
    req.on('end', () => {
      const { user, groups: now } = JSON.parse(body);
      if (now === null) delete groups[user]; else groups[user] = now;
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(groups));
    });
    return;
  }
  if (req.method === 'GET' && req.url === '/_test/last-logout') {
    res.writeHead(200, { 'content-type': 'application/x-www-form-urlencoded' });
    res.end(lastLogout);
    return;
  }
  callback(req, res);
});
console.log(`READY ${port}`);
