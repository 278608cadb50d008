// The wallet service's request errors: a status and the project's body `{"error": "<code>: <detail>"}`.
// Policy refusals are errors too (403 with the rule that refused), and nothing is signed when one is
// raised. Details never quote a key, a data key or a credential.
import { COMMON_STATUS, codedErrors } from "../platform/errors.ts";

const STATUS = {
  ...COMMON_STATUS,
  invalid_policy: 400,
  invalid_payment_required: 400,
  unsupported_version: 400,
  conflict: 409,
  // credentials
  unauthorized: 401,
  admin_disabled: 403,
  // policy refusals (nothing signed)
  policy_expired: 403,
  network_not_allowed: 403,
  scheme_not_allowed: 403,
  asset_not_allowed: 403,
  payto_not_allowed: 403,
  host_not_allowed: 403,
  amount_over_cap: 403,
  daily_cap_exceeded: 403,
  // the requirement or the chain (nothing signed)
  unsupported_requirement: 422,
  insufficient_funds: 409,
  insufficient_gas: 409,
  permit2_allowance_required: 409,
  network_not_configured: 422,
  // fetch on the agent's behalf
  destination_not_allowed: 403,
  upstream_unreachable: 502,
  upstream_timeout: 504,
  response_too_large: 502,
  // the service
  master_key_unavailable: 503,
  rpc_unavailable: 503,
} as const;

export type WalletErrorCode = keyof typeof STATUS;

export class WalletError extends codedErrors(STATUS) {}
