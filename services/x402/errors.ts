// Request-level errors: the contract's HTTP error body `{"error": "<code>: <detail>"}`.
// Payment-level outcomes are not errors: they are 200 responses with x402 reason codes.
import { CodedError } from "../platform/errors.ts";

export type RequestErrorCode =
  | "invalid_json"
  | "invalid_request"
  | "invalid_payload"
  | "unsupported_version"
  | "unsupported_scheme_network"
  | "amount_mismatch"
  | "unsupported_asset"
  | "unsupported_media_type"
  | "payload_too_large"
  | "not_found"
  | "method_not_allowed"
  | "backend_unavailable"
  | "backend_timeout"
  | "rate_limited"
  | "unauthorized"
  | "forbidden"
  | "api_key_required"
  | "api_key_invalid"
  | "api_key_revoked"
  | "api_key_out_of_scope"
  | "quota_exceeded"
  | "gas_budget_exhausted"
  | "payment_identifier_conflict"
  | "internal_error";

const STATUS: Record<RequestErrorCode, number> = {
  invalid_json: 400,
  invalid_request: 400,
  invalid_payload: 400,
  unsupported_version: 400,
  unsupported_scheme_network: 400,
  amount_mismatch: 400,
  unsupported_asset: 400,
  unsupported_media_type: 415,
  payload_too_large: 413,
  not_found: 404,
  method_not_allowed: 405,
  backend_unavailable: 503,
  backend_timeout: 504,
  rate_limited: 429,
  unauthorized: 401,
  forbidden: 403,
  api_key_required: 401,
  api_key_invalid: 401,
  api_key_revoked: 403,
  api_key_out_of_scope: 403,
  quota_exceeded: 429,
  gas_budget_exhausted: 429,
  payment_identifier_conflict: 409,
  internal_error: 500,
};

export class RequestError extends CodedError<RequestErrorCode> {
  constructor(code: RequestErrorCode, detail: string) {
    super(code, detail, STATUS[code], STATUS[code] === 401 ? { "www-authenticate": "Bearer" } : {});
  }
}
