// The hub's request errors: proper status codes and the contract's body `{"error": "<code>: <detail>"}`
// (the original answered a non-standard 599 with `{"Type":"hub","Message":...}`).
import { COMMON_STATUS, codedErrors } from "../platform/errors.ts";

const STATUS = {
  ...COMMON_STATUS,
  missing_signature: 401,
  invalid_signature: 401,
  expired_signature: 401,
  expiry_too_far: 401,
  replayed_nonce: 401,
  rate_limited: 429,
  quota_exceeded: 413,
} as const;

export type HubErrorCode = keyof typeof STATUS;

export class HubError extends codedErrors(STATUS) {}
