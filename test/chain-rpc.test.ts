// ChainClient.rpc, the verify path's JSON-RPC call without viem's transport: the same answers as
// viem's client, failover to the next endpoint, one retry of a round nobody answered, and viem's
// error classes, so a fault reads as "the RPC did not answer" exactly as through the client.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RpcRequestError } from "viem";
import { startAnvil, type AnvilNode } from "../services/devnet/anvil.ts";
import { createChainClient, isRpcUnavailable, watchRpc, type RpcWatch } from "../services/facilitator/chain.ts";
import { createMetrics } from "../services/platform/metrics.ts";
import { startRpcFaultProxy, type RpcFaultProxy } from "./helpers/rpc-fault-proxy.ts";

const CHAIN_ID = 31337;
// Creation code that reverts at once (PUSH1 0, PUSH1 0, REVERT): every node answers "execution reverted".
const REVERTING_CALL = { data: "0x60006000fd" };
let anvil: AnvilNode;
let first: RpcFaultProxy;
let second: RpcFaultProxy;

beforeAll(async () => {
  anvil = await startAnvil({ chainId: CHAIN_ID });
  first = await startRpcFaultProxy({ upstream: anvil.rpcUrl, holdMs: 10_000 });
  second = await startRpcFaultProxy({ upstream: anvil.rpcUrl });
});
afterAll(async () => {
  await first?.close();
  await second?.close();
  await anvil?.stop();
});

const requests = (metrics: ReturnType<typeof createMetrics>) => metrics.registry.getSingleMetricAsString("x402_rpc_requests_total");

describe("ChainClient.rpc", () => {
  it("answers as viem's client does, and counts the call like any other", async () => {
    const metrics = createMetrics("facilitator");
    const chain = createChainClient({ chainId: CHAIN_ID, rpcUrls: [anvil.rpcUrl], metrics });
    expect(await chain.rpc("eth_chainId", [])).toBe(`0x${CHAIN_ID.toString(16)}`);
    const call = { to: "0x0000000000000000000000000000000000000001", data: "0x" } as const;
    expect(await chain.rpc("eth_call", [call, "latest"])).toBe(await chain.client.request({ method: "eth_call", params: [call, "latest"] }));
    expect(await requests(metrics)).toMatch(/x402_rpc_requests_total\{[^}]*method="eth_chainId",result="ok"[^}]*\} 1/);
  });

  it("passes a call the first endpoint cannot answer to the next one", async () => {
    first.configure({ rate: 1, kinds: ["http_429"] });
    const metrics = createMetrics("facilitator");
    const chain = createChainClient({ chainId: CHAIN_ID, rpcUrls: [first.url, second.url], metrics });
    expect(await chain.rpc("eth_chainId", [])).toBe(`0x${CHAIN_ID.toString(16)}`);
    expect(await requests(metrics)).toMatch(/result="http_429"/);
    first.configure({});
  });

  it("tries a round that no endpoint answered once more", async () => {
    first.configure({ schedule: { eth_chainId: ["http_503", "ok"] } });
    const chain = createChainClient({ chainId: CHAIN_ID, rpcUrls: [first.url] });
    expect(await chain.rpc("eth_chainId", [])).toBe(`0x${CHAIN_ID.toString(16)}`);
    first.configure({});
  });

  it.each([
    ["http_429", "HttpRequestError"],
    ["http_502", "HttpRequestError"],
    ["malformed_json", "HttpRequestError"],
    ["truncated", "HttpRequestError"],
    ["rpc_error", "RpcRequestError"],
    ["timeout", "TimeoutError"],
  ] as const)("%s from every endpoint: %s, the RPC did not answer, noted in the watch", async (kind, type) => {
    first.configure({ rate: 1, kinds: [kind] });
    const chain = createChainClient({ chainId: CHAIN_ID, rpcUrls: [first.url], rpcTimeoutMs: 300 });
    const watch: RpcWatch = { failed: false };
    const error = await chain.rpc("eth_chainId", [], watch).catch((e: unknown) => e);
    expect((error as Error).name).toBe(type);
    expect(isRpcUnavailable(error)).toBe(true);
    expect(watch.failed).toBe(true);
    // Without an explicit watch, the request's watchRpc hears of it, as with viem's client.
    expect((await watchRpc(() => chain.rpc("eth_chainId", []).catch(() => undefined))).failed).toBe(true);
    first.configure({});
  });

  it("a revert is an answer: thrown at once, not tried elsewhere, not a failure of the RPC", async () => {
    const chain = createChainClient({ chainId: CHAIN_ID, rpcUrls: [first.url, second.url] });
    const before = second.calls.eth_call ?? 0;
    const watch: RpcWatch = { failed: false };
    const error = await chain.rpc("eth_call", [REVERTING_CALL, "latest"], watch).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RpcRequestError);
    expect(isRpcUnavailable(error)).toBe(false);
    expect(watch.failed).toBe(false);
    expect(second.calls.eth_call ?? 0).toBe(before);
    // viem's client says the same (its first line is what an answer quotes).
    const viaViem = await chain.client.request({ method: "eth_call", params: [REVERTING_CALL as never, "latest"] }).catch((e: unknown) => e);
    expect((error as Error).message.split("\n")[0]).toBe((viaViem as Error).message.split("\n")[0]);
  });
});
