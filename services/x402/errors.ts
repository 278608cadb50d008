// Request-level errors: the contract's HTTP error body `{"error": "<code>: <detail>"}`.
// Payment-level outcomes are not errors: they are 200 responses with x402 reason codes.
import { COMMON_STATUS, codedErrors } from "../platform/errors.ts";

const STATUS = {
  ...COMMON_STATUS,
  invalid_payload: 400,
  unsupported_version: 400,
  unsupported_scheme_network: 400,
  amount_mismatch: 400,
  unsupported_asset: 400,
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
  gas_allowance_required: 400,
  payment_identifier_conflict: 409,
  invalid_status_query: 400,
  payment_not_found: 404,
  ambiguous_payment: 409,
} as const;

export type RequestErrorCode = keyof typeof STATUS;

export class RequestError extends codedErrors(STATUS) {
  constructor(code: RequestErrorCode, detail: string, headers: Record<string, string> = {}) {
    super(code, detail, STATUS[code] === 401 ? { "www-authenticate": "Bearer", ...headers } : headers);
  }
}
