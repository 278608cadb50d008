// The wallet service's request errors: a status and the project's body `{"error": "<code>: <detail>"}`.
// Policy refusals are errors too (403 with the rule that refused), and nothing is signed when one is
// raised. Details never quote a key, a data key or a credential.
import { CodedError } from "../platform/errors.ts";

export type WalletErrorCode =
  // the request
  | "invalid_json"
  | "invalid_request"
  | "invalid_policy"
  | "invalid_payment_required"
  | "unsupported_version"
  | "unsupported_media_type"
  | "payload_too_large"
  | "not_found"
  | "method_not_allowed"
  | "conflict"
  // credentials
  | "unauthorized"
  | "admin_disabled"
  // policy refusals (nothing signed)
  | "policy_expired"
  | "network_not_allowed"
  | "scheme_not_allowed"
  | "asset_not_allowed"
  | "payto_not_allowed"
  | "host_not_allowed"
  | "amount_over_cap"
  | "daily_cap_exceeded"
  // the requirement or the chain (nothing signed)
  | "unsupported_requirement"
  | "insufficient_funds"
  | "insufficient_gas"
  | "permit2_allowance_required"
  | "network_not_configured"
  // fetch on the agent's behalf
  | "destination_not_allowed"
  | "upstream_unreachable"
  | "upstream_timeout"
  | "response_too_large"
  // the service
  | "master_key_unavailable"
  | "rpc_unavailable"
  | "backend_unavailable"
  | "internal_error";

const STATUS: Record<WalletErrorCode, number> = {
  invalid_json: 400,
  invalid_request: 400,
  invalid_policy: 400,
  invalid_payment_required: 400,
  unsupported_version: 400,
  unsupported_media_type: 415,
  payload_too_large: 413,
  not_found: 404,
  method_not_allowed: 405,
  conflict: 409,
  unauthorized: 401,
  admin_disabled: 403,
  policy_expired: 403,
  network_not_allowed: 403,
  scheme_not_allowed: 403,
  asset_not_allowed: 403,
  payto_not_allowed: 403,
  host_not_allowed: 403,
  amount_over_cap: 403,
  daily_cap_exceeded: 403,
  unsupported_requirement: 422,
  insufficient_funds: 409,
  insufficient_gas: 409,
  permit2_allowance_required: 409,
  network_not_configured: 422,
  destination_not_allowed: 403,
  upstream_unreachable: 502,
  upstream_timeout: 504,
  response_too_large: 502,
  master_key_unavailable: 503,
  rpc_unavailable: 503,
  backend_unavailable: 503,
  internal_error: 500,
};

/** Codes that mean "the policy (or the chain) refused this payment; nothing was signed". */
export const REFUSAL_CODES: ReadonlySet<WalletErrorCode> = new Set<WalletErrorCode>([
  "policy_expired",
  "network_not_allowed",
  "scheme_not_allowed",
  "asset_not_allowed",
  "payto_not_allowed",
  "host_not_allowed",
  "amount_over_cap",
  "daily_cap_exceeded",
  "unsupported_requirement",
  "insufficient_funds",
  "permit2_allowance_required",
]);

export class WalletError extends CodedError<WalletErrorCode> {
  constructor(code: WalletErrorCode, detail: string, headers: Record<string, string> = {}) {
    super(code, detail, STATUS[code], headers);
  }
}
