// A small JSON-RPC proxy in front of a devnet anvil that refuses transactions under the chain's
// minimum tip, as Polygon PoS and BNB Smart Chain nodes do (anvil accepts any tip). Everything else
// passes through unchanged. It counts what it forwarded and refused, so tests can prove a
// below-floor transaction was never broadcast.
import { createServer, type Server } from "node:http";
import { parseTransaction, type Hex } from "viem";

export interface FeeFloorProxy {
  url: string;
  /** Hashes-free record of raw transactions seen: the tip of each, and whether it was refused. */
  transactions: { tip: bigint; refused: boolean }[];
  close(): Promise<void>;
}

interface RpcRequest {
  jsonrpc?: string;
  id?: unknown;
  method?: string;
  params?: unknown[];
}

const SEND_METHODS = new Set(["eth_sendRawTransaction", "eth_sendRawTransactionSync"]);

/** The tip a raw transaction offers: maxPriorityFeePerGas, or gasPrice for legacy and EIP-2930 ones. */
export function offeredTip(raw: Hex): bigint {
  const tx = parseTransaction(raw);
  return tx.maxPriorityFeePerGas ?? tx.gasPrice ?? 0n;
}

export async function startFeeFloorProxy(opts: { upstream: string; minPriorityFeePerGasWei: bigint; host?: string }): Promise<FeeFloorProxy> {
  const transactions: FeeFloorProxy["transactions"] = [];

  /** The node's refusal of one request, or undefined to forward it. */
  function refusal(req: RpcRequest): object | undefined {
    if (!req || !SEND_METHODS.has(String(req.method))) return undefined;
    let tip: bigint;
    try {
      tip = offeredTip(req.params?.[0] as Hex);
    } catch {
      return undefined; // malformed: the node answers for itself
    }
    const refused = tip < opts.minPriorityFeePerGasWei;
    transactions.push({ tip, refused });
    // geth's txpool wording, which Bor and BSC's node keep.
    return refused ? { jsonrpc: "2.0", id: req.id ?? null, error: { code: -32000, message: `transaction underpriced: gas tip cap ${tip}, minimum needed ${opts.minPriorityFeePerGasWei}` } } : undefined;
  }

  async function forward(body: string): Promise<string> {
    const res = await fetch(opts.upstream, { method: "POST", headers: { "content-type": "application/json" }, body });
    return res.text();
  }

  const server: Server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on("data", (c: Buffer) => chunks.push(c));
    request.on("end", () => {
      void (async () => {
        const body = Buffer.concat(chunks).toString("utf8");
        let parsed: RpcRequest | RpcRequest[];
        try {
          parsed = JSON.parse(body) as RpcRequest | RpcRequest[];
        } catch {
          parsed = {};
        }
        let out: string;
        if (Array.isArray(parsed)) {
          // A batch: refused entries are answered here, the rest forwarded together, order kept.
          const answers = parsed.map(refusal);
          const rest = parsed.filter((_, i) => !answers[i]);
          const forwarded = rest.length ? (JSON.parse(await forward(JSON.stringify(rest))) as unknown[]) : [];
          let k = 0;
          out = JSON.stringify(answers.map((a) => a ?? forwarded[k++]));
        } else {
          const refused = refusal(parsed);
          out = refused ? JSON.stringify(refused) : await forward(body);
        }
        response.writeHead(200, { "content-type": "application/json" }).end(out);
      })().catch(() => response.writeHead(502).end());
    });
  });
  await new Promise<void>((resolve) => server.listen(0, opts.host ?? "127.0.0.1", resolve));
  const address = server.address();
  const port = typeof address === "object" && address ? address.port : 0;
  return {
    url: `http://${opts.host ?? "127.0.0.1"}:${port}`,
    transactions,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections(); // keep-alive clients would hold close() open
      }),
  };
}
