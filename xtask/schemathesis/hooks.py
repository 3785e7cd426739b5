# schemathesis hooks for `cargo xtask schemathesis` (loaded through
# SCHEMATHESIS_HOOKS, which xtask sets).
#
# The CA throttles bad bearer tokens per source address: past ten failures
# from one address (then one per six seconds) an unknown token is answered
# 429 `throttled` with Retry-After instead of 401 (a valid token is never
# throttled; documented as the 429 response of every operation that takes a
# token). Every schemathesis request comes from 127.0.0.1, so its probes
# with invalid credentials soon get 429. That is still the request refused
# for its credentials, so the `ignored_auth` check counts 429 with 401 and
# 403 as enforcement; an invalid token answered 2xx still fails the run.
import schemathesis.specs.openapi.checks as checks

checks.AUTH_REJECTION_STATUSES = frozenset({401, 403, 429})
