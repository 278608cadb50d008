// An HTTP proxy in front of an RPC node that counts what each client really sends: HTTP round
// trips and JSON-RPC calls (batch elements counted one by one).
import { createServer, type Server } from "node:http";
import { request } from "undici";

export interface CountingProxy {
  url: string;
  counts(): { roundTrips: number; calls: number; methods: Record<string, number> };
  reset(): void;
  close(): Promise<void>;
}

/** `rttMs`: added to every HTTP round trip, as an RPC provider that far away would (a batch is one round trip). */
export async function startCountingProxy(target: string, rttMs = 0): Promise<CountingProxy> {
  let roundTrips = 0;
  let calls = 0;
  let methods: Record<string, number> = {};
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", async () => {
      const body = Buffer.concat(chunks);
      roundTrips++;
      try {
        const parsed = JSON.parse(body.toString());
        for (const call of Array.isArray(parsed) ? parsed : [parsed]) {
          calls++;
          methods[call.method] = (methods[call.method] ?? 0) + 1;
        }
      } catch {
        // not JSON: forwarded as is
      }
      if (rttMs > 0) await new Promise((r) => setTimeout(r, rttMs));
      try {
        const upstream = await request(target, { method: "POST", headers: { "content-type": "application/json" }, body });
        res.writeHead(upstream.statusCode, { "content-type": "application/json" });
        res.end(Buffer.from(await upstream.body.arrayBuffer()));
      } catch {
        res.writeHead(502).end();
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${(server.address() as { port: number }).port}`,
    counts: () => ({ roundTrips, calls, methods: { ...methods } }),
    reset: () => {
      roundTrips = 0;
      calls = 0;
      methods = {};
    },
    close: () => new Promise((r) => server.close(() => r())),
  };
}
