// The one error shape every service answers with: `{"error": "<code>: <detail>"}` and an HTTP
// status chosen by the code. Each service keeps its own closed set of codes.
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
