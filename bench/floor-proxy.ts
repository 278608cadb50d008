// The floor the router is measured against (npm run bench): a bare node:http server that reads the
// network from each JSON body, as any router on the CAIP-2 network must, and forwards the request
// to one facilitator through an undici keep-alive pool, adding Server-Timing as the router does.
// None of the router's work besides: no validation, routing table, metrics, spans, load shedding
// or API keys. Its CPU and latency are what any Node proxy costs on the machine at hand.
import { createServer } from "node:http";
import { Pool } from "undici";

const upstream = new URL(process.env.UPSTREAM!);
const pool = new Pool(upstream.origin, { connections: 128, keepAliveTimeout: 30_000 });

createServer((req, res) => {
  if (req.method !== "POST") return void res.writeHead(200).end(); // up (the bench waits for it)
  const chunks: Buffer[] = [];
  req.on("data", (chunk: Buffer) => chunks.push(chunk));
  req.on("end", () => {
    const text = Buffer.concat(chunks).toString("utf8");
    let network: unknown;
    try {
      network = (JSON.parse(text) as { paymentRequirements?: { network?: unknown } }).paymentRequirements?.network;
    } catch {
      network = undefined;
    }
    if (typeof network !== "string") return void res.writeHead(400).end();
    const sentAt = performance.now();
    const answer: Buffer[] = [];
    let status = 502;
    pool.dispatch(
      { method: "POST", path: req.url ?? "/", headers: { "content-type": "application/json" }, body: text },
      {
        onRequestStart() {},
        onResponseStart(_controller, statusCode) {
          status = statusCode;
        },
        onResponseData(_controller, chunk) {
          answer.push(chunk);
        },
        onResponseEnd() {
          const body = Buffer.concat(answer);
          res.writeHead(status, { "content-type": "application/json; charset=utf-8", "content-length": body.length, "server-timing": `upstream;dur=${(performance.now() - sentAt).toFixed(2)}` }).end(body);
        },
        onResponseError() {
          res.writeHead(502).end();
        },
      },
    );
  });
}).listen(Number(process.env.PORT), "127.0.0.1");
