// A plain-HTTP proxy in front of the test kube-apiserver (TLS upstream, the client's own bearer
// token passed through), so a test can do to a client what a network does: end its watches,
// hold its requests back for a while, and see what the server answered (lists, 410 Gone).
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { request as httpsRequest } from "node:https";
import type { Socket } from "node:net";

export interface ApiProxy {
  url: string;
  stats(): { lists: number; watches: number; gone: number };
  /** New requests wait until release(). */
  hold(): void;
  release(): void;
  /** The next request matching `when` is answered 500 by the proxy (fault injection). */
  failOnce(when: (method: string, path: string) => boolean): void;
  /** Everything the server answered to requests whose path matches (lists, watch streams, reads), as text. */
  received(path: RegExp): string;
  /** Ends every open watch response cleanly (the client re-watches from its last resourceVersion). */
  endWatches(): number;
  close(): Promise<void>;
}

export async function startApiProxy(upstream: string, ca: string): Promise<ApiProxy> {
  const target = new URL(upstream);
  const stats = { lists: 0, watches: 0, gone: 0 };
  const watches = new Map<ServerResponse, IncomingMessage>();
  const held: (() => void)[] = [];
  const faults: ((method: string, path: string) => boolean)[] = [];
  let holding = false;
  const sockets = new Set<Socket>();
  const transcript: { path: string; chunks: Buffer[] }[] = [];

  const forward = (req: IncomingMessage, res: ServerResponse) => {
    const url = new URL(req.url ?? "/", "http://proxy");
    const fault = faults.findIndex((f) => f(req.method ?? "GET", url.pathname));
    if (fault >= 0) {
      faults.splice(fault, 1);
      req.resume();
      res.writeHead(500, { "content-type": "application/json" });
      res.end(JSON.stringify({ kind: "Status", apiVersion: "v1", metadata: {}, status: "Failure", message: "injected by the test's proxy", reason: "InternalError", code: 500 }));
      return;
    }
    const isWatch = url.searchParams.get("watch") === "true" || url.searchParams.get("watch") === "1";
    if (req.method === "GET" && isWatch) stats.watches++;
    else if (req.method === "GET" && /\/(api\/v1|apis\/[^/]+\/[^/]+)(\/namespaces\/[^/]+)?\/[a-z]+$/.test(url.pathname)) stats.lists++;
    const up = httpsRequest(
      // identity encoding: what the server answered stays readable in the transcript
      { host: target.hostname, port: target.port, method: req.method, path: req.url, headers: { ...req.headers, host: target.host, "accept-encoding": "identity" }, ca },
      (upRes) => {
        const entry = { path: url.pathname, chunks: [] as Buffer[] };
        transcript.push(entry);
        upRes.on("data", (chunk: Buffer) => void entry.chunks.push(chunk));
        res.writeHead(upRes.statusCode ?? 502, upRes.headers);
        res.flushHeaders(); // a watch answers headers first and events later
        if (isWatch) {
          watches.set(res, upRes);
          res.once("close", () => {
            watches.delete(res);
            upRes.destroy();
          });
          upRes.on("data", (chunk: Buffer) => {
            if (/"type":"ERROR".*"code":410/.test(chunk.toString())) stats.gone++;
          });
        }
        upRes.pipe(res);
      },
    );
    up.on("error", () => {
      if (!res.headersSent) res.writeHead(502);
      res.end();
    });
    req.pipe(up);
  };
  const server: Server = createServer((req, res) => {
    if (holding) held.push(() => forward(req, res));
    else forward(req, res);
  });
  server.on("connection", (s) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  return {
    url: `http://127.0.0.1:${typeof address === "object" && address ? address.port : 0}`,
    stats: () => ({ ...stats }),
    received: (path) => transcript.filter((t) => path.test(t.path)).map((t) => Buffer.concat(t.chunks).toString("utf8")).join("\n"),
    failOnce: (when) => void faults.push(when),
    hold: () => void (holding = true),
    release: () => {
      holding = false;
      for (const go of held.splice(0)) go();
    },
    endWatches: () => {
      const n = watches.size;
      for (const [res, upRes] of [...watches]) {
        watches.delete(res);
        upRes.unpipe(res);
        upRes.destroy();
        res.end(); // the terminating chunk: a clean end of the watch, as a server timeout gives
      }
      return n;
    },
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
