// The hub's request errors: proper status codes and the contract's body `{"error": "<code>: <detail>"}`
// (the original answered a non-standard 599 with `{"Type":"hub","Message":...}`).
import { CodedError } from "../platform/errors.ts";

export type HubErrorCode =
  | "invalid_json"
  | "invalid_request"
  | "unsupported_media_type"
  | "payload_too_large"
  | "not_found"
  | "method_not_allowed"
  | "missing_signature"
  | "invalid_signature"
  | "expired_signature"
  | "expiry_too_far"
  | "replayed_nonce"
  | "rate_limited"
  | "quota_exceeded"
  | "backend_unavailable"
  | "internal_error";

const STATUS: Record<HubErrorCode, number> = {
  invalid_json: 400,
  invalid_request: 400,
  unsupported_media_type: 415,
  payload_too_large: 413,
  not_found: 404,
  method_not_allowed: 405,
  missing_signature: 401,
  invalid_signature: 401,
  expired_signature: 401,
  expiry_too_far: 401,
  replayed_nonce: 401,
  rate_limited: 429,
  quota_exceeded: 413,
  backend_unavailable: 503,
  internal_error: 500,
};

export class HubError extends CodedError<HubErrorCode> {
  constructor(code: HubErrorCode, detail: string, headers: Record<string, string> = {}) {
    super(code, detail, STATUS[code], headers);
  }
}
