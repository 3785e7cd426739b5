// A real OpenID provider for the sign-in tests: panva's oidc-provider
// (installed pinned into target/oidc-provider by the tests), on 127.0.0.1,
// with one confidential client, a `groups` claim, its development login
// form (any password) and signing keys from the environment, so a test
// can restart it with a new key (rotation).
//
// Environment: OP_MODULE (path of oidc-provider's package directory),
// OP_PORT (0: any), OP_REDIRECT (the CA's callback URL), OP_SECRET (the
// client secret), OP_KID (the signing key's id), OP_GROUPS (JSON: user →
// groups). Prints `READY <port>` once it listens.
import http from 'node:http';
import crypto from 'node:crypto';
import { pathToFileURL } from 'node:url';
import path from 'node:path';

const { default: Provider } = await import(
  pathToFileURL(path.join(process.env.OP_MODULE, 'lib', 'index.js')).href
);

const groups = JSON.parse(process.env.OP_GROUPS || '{}');
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
    grant_types: ['authorization_code'],
    response_types: ['code'],
  }],
  jwks: { keys: [jwk] },
  claims: { openid: ['sub'], profile: ['name', 'preferred_username'], groups: ['groups'] },
  scopes: ['openid', 'profile', 'groups'],
  conformIdTokenClaims: false,
  cookies: { keys: ['test-cookie-key-0123456789'] },
  findAccount: async (ctx, id) => ({
    accountId: id,
    claims: async () => ({ sub: id, name: id, preferred_username: id, groups: groups[id] || [] }),
  }),
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
server.on('request', provider.callback());
console.log(`READY ${port}`);
