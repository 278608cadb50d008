// The one error shape every service answers with: `{"error": "<code>: <detail>"}` and an HTTP
// status chosen by the code. Each service keeps its own closed set of codes: the HTTP kit's common
// ones spread into a status table, whose keys are the service's code type.
export class CodedError<C extends string = string> extends Error {
  constructor(
    readonly code: C,
    readonly detail: string,
    readonly status: number,
    /** Extra response headers (Allow on 405, Retry-After on 429, WWW-Authenticate on 401). */
    readonly headers: Record<string, string> = {},
  ) {
    super(`${code}: ${detail}`);
  }

  body(): { error: string } {
    return { error: this.message };
  }
}

/** The codes the HTTP kit answers itself, in every service's catalogue. */
export const COMMON_STATUS = {
  invalid_json: 400,
  invalid_request: 400,
  unsupported_media_type: 415,
  payload_too_large: 413,
  not_found: 404,
  method_not_allowed: 405,
  backend_unavailable: 503,
  internal_error: 500,
} as const;

/** A service's error class, its codes and their statuses from one table: `class HubError extends codedErrors(STATUS) {}`. */
export function codedErrors<S extends Record<string, number>>(status: S) {
  return class extends CodedError<Extract<keyof S, string>> {
    constructor(code: Extract<keyof S, string>, detail: string, headers: Record<string, string> = {}) {
      super(code, detail, status[code]!, headers);
    }
  };
}
