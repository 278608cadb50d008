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
    expect(await metrics.registry.getSingleMetricAsString("x402_rpc_calls_total")).toMatch(/x402_rpc_calls_total\{[^}]*method="eth_chainId"[^}]*\} 1/);
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

describe("ChainClient.rpc batches", () => {
  const call = (n: number) => ({ to: "0x0000000000000000000000000000000000000001", data: `0x${n.toString(16).padStart(2, "0")}` }) as const;
  const requestsOf = (p: RpcFaultProxy) => ({ ...p.requests });
  const since = (p: RpcFaultProxy, before: { total: number; batches: number }) => ({ total: p.requests.total - before.total, batches: p.requests.batches - before.batches });

  it("sends calls made together as one round trip, each with its own answer: a revert stays that call's", async () => {
    const metrics = createMetrics("facilitator");
    const chain = createChainClient({ chainId: CHAIN_ID, rpcUrls: [second.url], metrics });
    const before = requestsOf(second);
    const results = await Promise.allSettled([chain.rpc("eth_chainId", []), chain.rpc("eth_call", [call(1), "latest"]), chain.rpc("eth_call", [REVERTING_CALL, "latest"]), chain.rpc("eth_getBalance", ["0x0000000000000000000000000000000000000002", "latest"])]);
    expect(since(second, before)).toEqual({ total: 1, batches: 1 });
    // One round trip, four calls: each counted by its own method, none as "batch".
    const calls = await metrics.registry.getSingleMetricAsString("x402_rpc_calls_total");
    expect(calls).toMatch(/method="eth_call"[^}]*\} 2$/m);
    expect(calls).toMatch(/method="eth_chainId"[^}]*\} 1$/m);
    expect(calls).toMatch(/method="eth_getBalance"[^}]*\} 1$/m);
    expect(calls).not.toMatch(/method="batch"/);
    expect(results[0]).toEqual({ status: "fulfilled", value: `0x${CHAIN_ID.toString(16)}` });
    expect(results[1]).toEqual({ status: "fulfilled", value: await chain.client.request({ method: "eth_call", params: [call(1), "latest"] }) });
    expect(results[2]!.status).toBe("rejected");
    const revert = (results[2] as PromiseRejectedResult).reason;
    expect(revert).toBeInstanceOf(RpcRequestError);
    expect(isRpcUnavailable(revert)).toBe(false);
    expect(results[3]).toEqual({ status: "fulfilled", value: "0x0" });
    expect(await requests(metrics)).toMatch(/method="batch",result="rpc_error"[^}]*\} 1/);
  });

  it("sends at most rpcMaxBatch calls per round trip, and a lone call as a plain request", async () => {
    const chain = createChainClient({ chainId: CHAIN_ID, rpcUrls: [second.url], rpcMaxBatch: 4 });
    let before = requestsOf(second);
    const answers = await Promise.all(Array.from({ length: 10 }, (_, i) => chain.rpc("eth_call", [call(i), "latest"])));
    expect(answers).toHaveLength(10);
    expect(since(second, before)).toEqual({ total: 3, batches: 3 }); // 4 + 4 + 2
    before = requestsOf(second);
    await chain.rpc("eth_chainId", []);
    expect(since(second, before)).toEqual({ total: 1, batches: 0 });
    // rpcMaxBatch 1: never a batch.
    const single = createChainClient({ chainId: CHAIN_ID, rpcUrls: [second.url], rpcMaxBatch: 1 });
    before = requestsOf(second);
    await Promise.all([single.rpc("eth_chainId", []), single.rpc("eth_chainId", [])]);
    expect(since(second, before)).toEqual({ total: 2, batches: 0 });
  });

  it("never batches a call whose answer may take long (a synchronous send waits for its block); plain sends share round trips", async () => {
    const chain = createChainClient({ chainId: CHAIN_ID, rpcUrls: [second.url] });
    let before = requestsOf(second);
    await Promise.allSettled([chain.rpc("eth_sendRawTransactionSync", ["0x00"]), chain.rpc("eth_chainId", [])]);
    expect(since(second, before)).toEqual({ total: 2, batches: 0 });
    // A plain send answers at once: batched. The node's error for this one (not a revert) may be the
    // batch's, so it is asked again alone: the batch, then the send.
    before = requestsOf(second);
    const [sent, chainId] = await Promise.allSettled([chain.rpc("eth_sendRawTransaction", ["0x00"]), chain.rpc("eth_chainId", [])]);
    expect(sent.status).toBe("rejected");
    expect(chainId).toEqual({ status: "fulfilled", value: `0x${CHAIN_ID.toString(16)}` });
    expect(since(second, before)).toEqual({ total: 2, batches: 1 });
  });

  it("with every connection busy, calls made in separate turns wait and go as one batch when a round trip ends", async () => {
    // 32 calls the endpoint holds (every connection of the pool), ended by the client's timeout; a
    // method never batched, so each takes a connection of its own.
    first.configure({ rate: 1, kinds: ["timeout"], methods: ["eth_getTransactionByHash"] });
    const chain = createChainClient({ chainId: CHAIN_ID, rpcUrls: [first.url], rpcTimeoutMs: 1000 });
    const before = requestsOf(first);
    const held = Array.from({ length: 32 }, () => chain.rpc("eth_getTransactionByHash", [`0x${"11".repeat(32)}`]).catch(() => undefined));
    const answers: Promise<unknown>[] = [];
    for (let i = 0; i < 3; i++) {
      answers.push(chain.rpc("eth_chainId", []));
      await new Promise((r) => setImmediate(r)); // each call in a turn of its own
    }
    try {
      expect(await Promise.all(answers)).toEqual(Array(3).fill(`0x${CHAIN_ID.toString(16)}`));
      await Promise.all(held);
    } finally {
      first.configure({});
    }
    // The held calls (each tried twice: the round nobody answered is tried once more), and one batch of the three.
    const counted = since(first, before);
    expect(counted.batches).toBe(1);
    expect(counted.total).toBe(64 + 1);
  });

  it("an endpoint that refuses batches gets its calls one by one, every call answered", async () => {
    first.configure({ batches: "refuse" });
    const chain = createChainClient({ chainId: CHAIN_ID, rpcUrls: [first.url] });
    let before = requestsOf(first);
    const answers = await Promise.all([chain.rpc("eth_chainId", []), chain.rpc("eth_call", [call(2), "latest"]), chain.rpc("eth_chainId", [])]);
    expect(answers[0]).toBe(`0x${CHAIN_ID.toString(16)}`);
    expect(answers[2]).toBe(`0x${CHAIN_ID.toString(16)}`);
    expect(since(first, before)).toEqual({ total: 4, batches: 1 }); // the refused batch, then each call
    before = requestsOf(first);
    await Promise.all([chain.rpc("eth_chainId", []), chain.rpc("eth_chainId", [])]);
    expect(since(first, before)).toEqual({ total: 2, batches: 0 }); // no batch tried again meanwhile
    first.configure({});
  });

  it("a call the batch's answer leaves out is the RPC not answering: tried again, noted if never answered", async () => {
    first.configure({ batches: "omit_last" });
    const chain = createChainClient({ chainId: CHAIN_ID, rpcUrls: [first.url] });
    const watches: RpcWatch[] = [{ failed: false }, { failed: false }];
    // The retry of the omitted call goes alone (a plain request), so it is answered.
    const answers = await Promise.all([chain.rpc("eth_chainId", [], watches[0]), chain.rpc("eth_blockNumber", [], watches[1])]);
    expect(answers[0]).toBe(`0x${CHAIN_ID.toString(16)}`);
    expect(answers[1]).toMatch(/^0x[0-9a-f]+$/);
    expect(watches.map((w) => w.failed)).toEqual([false, false]);
    first.configure({});
  });

  it("answers whose ids a gateway turned into strings still reach their calls", async () => {
    first.configure({ batches: "string_ids" });
    const chain = createChainClient({ chainId: CHAIN_ID, rpcUrls: [first.url] });
    const before = requestsOf(first);
    const answers = await Promise.all([chain.rpc("eth_chainId", []), chain.rpc("eth_getBalance", ["0x0000000000000000000000000000000000000002", "latest"])]);
    expect(answers).toEqual([`0x${CHAIN_ID.toString(16)}`, "0x0"]);
    expect(since(first, before)).toEqual({ total: 1, batches: 1 });
    first.configure({});
  });

  it("a gateway that renumbers a batch's answers: no call takes another's answer (a revert stays a revert), and that endpoint gets single calls", async () => {
    first.configure({ batches: "renumber" });
    const chain = createChainClient({ chainId: CHAIN_ID, rpcUrls: [first.url] });
    const results = await Promise.allSettled([chain.rpc("eth_call", [REVERTING_CALL, "latest"]), chain.rpc("eth_chainId", []), chain.rpc("eth_getBalance", ["0x0000000000000000000000000000000000000002", "latest"])]);
    expect(results[0]!.status).toBe("rejected");
    expect((results[0] as PromiseRejectedResult).reason).toBeInstanceOf(RpcRequestError);
    expect(results.slice(1)).toEqual([{ status: "fulfilled", value: `0x${CHAIN_ID.toString(16)}` }, { status: "fulfilled", value: "0x0" }]);
    const before = requestsOf(first);
    await Promise.all([chain.rpc("eth_chainId", []), chain.rpc("eth_chainId", [])]);
    expect(since(first, before)).toEqual({ total: 2, batches: 0 });
    first.configure({});
  });

  it("a rate limit answered to a whole batch fails each call as unavailable (the next endpoint takes them); batches go on afterwards", async () => {
    first.configure({ batches: "rate_limited" });
    const alone = createChainClient({ chainId: CHAIN_ID, rpcUrls: [first.url] });
    const answers = await Promise.all([alone.rpc("eth_chainId", []), alone.rpc("eth_blockNumber", [])]);
    // Each call's retry went alone, and single calls are not rate limited here: answered.
    expect(answers[0]).toBe(`0x${CHAIN_ID.toString(16)}`);
    const withFallback = createChainClient({ chainId: CHAIN_ID, rpcUrls: [first.url, second.url] });
    const fromSecond = second.calls.eth_chainId ?? 0;
    expect(await Promise.all([withFallback.rpc("eth_chainId", []), withFallback.rpc("eth_chainId", [])])).toEqual([`0x${CHAIN_ID.toString(16)}`, `0x${CHAIN_ID.toString(16)}`]);
    expect((second.calls.eth_chainId ?? 0) - fromSecond).toBe(2);
    first.configure({});
    const before = requestsOf(first);
    await Promise.all([withFallback.rpc("eth_chainId", []), withFallback.rpc("eth_chainId", [])]);
    expect(since(first, before)).toEqual({ total: 1, batches: 1 }); // no ten-minute refusal for a rate limit
  });

  it("a per-call error that may be about the batch (a size limit) is asked again alone, not taken as the call's answer", async () => {
    first.configure({ batches: "too_large_last" });
    const chain = createChainClient({ chainId: CHAIN_ID, rpcUrls: [first.url] });
    const watch: RpcWatch = { failed: false };
    expect(await Promise.all([chain.rpc("eth_chainId", []), chain.rpc("eth_call", [call(7), "latest"], watch)])).toEqual([`0x${CHAIN_ID.toString(16)}`, await chain.client.request({ method: "eth_call", params: [call(7), "latest"] })]);
    expect(watch.failed).toBe(false);
    first.configure({});
  });

  it("a batch nobody answered fails each of its calls as unavailable, each error naming its own call only, or passes them to the next endpoint", async () => {
    first.configure({ rate: 1, kinds: ["http_503"] });
    const alone = createChainClient({ chainId: CHAIN_ID, rpcUrls: [first.url] });
    const watch: RpcWatch = { failed: false };
    // Two payers' simulations in one batch: neither's error may quote the other's calldata.
    const [mine, theirs] = ["0x" + "aa".repeat(40), "0x" + "bb".repeat(40)];
    const errors = await Promise.all([
      alone.rpc("eth_call", [{ to: "0x0000000000000000000000000000000000000001", data: mine }, "latest"], watch).catch((e: unknown) => e),
      alone.rpc("eth_call", [{ to: "0x0000000000000000000000000000000000000001", data: theirs }, "latest"]).catch((e: unknown) => e),
    ]);
    for (const e of errors) expect(isRpcUnavailable(e)).toBe(true);
    expect(watch.failed).toBe(true);
    expect((errors[0] as Error).message).toContain(mine);
    expect((errors[0] as Error).message).not.toContain(theirs);
    expect((errors[1] as Error).message).not.toContain(mine);
    const withFallback = createChainClient({ chainId: CHAIN_ID, rpcUrls: [first.url, second.url] });
    const before = requestsOf(second);
    const answers = await Promise.all([withFallback.rpc("eth_chainId", []), withFallback.rpc("eth_chainId", [])]);
    expect(answers).toEqual([`0x${CHAIN_ID.toString(16)}`, `0x${CHAIN_ID.toString(16)}`]);
    // Calls of a batch that failed whole go on alone: neither waits on the other again.
    expect(since(second, before)).toEqual({ total: 2, batches: 0 });
    first.configure({});
  });
});
