// Reads shared by concurrent requests (an account's code: one read for a payer's burst) must still
// give each request its own "the RPC did not answer" when the read fails: a request that joined
// another's read and heard only the error would let the reference mechanism turn it into a verdict
// (an invalid signature), answered and recorded for a payment that may be valid.
import { afterAll, beforeAll, expect, it } from "vitest";
import { pino } from "pino";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { startAnvil, type AnvilNode } from "../services/devnet/anvil.ts";
import { createChainClient, watchRpc } from "../services/facilitator/chain.ts";
import { SETTLEMENT_MIGRATIONS, createSettlementStore } from "../services/facilitator/settlement/store.ts";
import { createOutboxSigner } from "../services/facilitator/settlement/outbox-signer.ts";
import { migrate, openDatabase, type Database } from "../services/platform/storage.ts";
import { startRpcFaultProxy, type RpcFaultProxy } from "./helpers/rpc-fault-proxy.ts";

const CHAIN_ID = 31337;
let anvil: AnvilNode;
let proxy: RpcFaultProxy;
let db: Database;

beforeAll(async () => {
  anvil = await startAnvil({ chainId: CHAIN_ID });
  proxy = await startRpcFaultProxy({ upstream: anvil.rpcUrl });
  db = await openDatabase();
  await migrate(db, SETTLEMENT_MIGRATIONS);
});
afterAll(async () => {
  await db?.close();
  await proxy?.close();
  await anvil?.stop();
});

it("a code read shared by concurrent requests: its failure is each request's 'no answer', and it is read once", async () => {
  const chain = createChainClient({ chainId: CHAIN_ID, rpcUrls: [proxy.url] });
  const signer = createOutboxSigner({ chain, accounts: [privateKeyToAccount(generatePrivateKey())], store: createSettlementStore(db, `eip155:${CHAIN_ID}`), receiptTimeoutMs: 1000, confirmations: 1, isFunded: () => true, logger: pino({ level: "silent" }) });
  const address = privateKeyToAccount(generatePrivateKey()).address;
  try {
    proxy.configure({ rate: 1, kinds: ["http_503"], methods: ["eth_getCode"] });
    const before = proxy.requests.total;
    // As the reference mechanisms do (an unknown code reads as none): the error itself is swallowed,
    // so only the request's watch can say that the RPC did not answer.
    const results = await Promise.all([1, 2, 3].map(() => watchRpc(() => signer.getCode({ address }).catch(() => undefined))));
    expect(results.map((r) => r.failed)).toEqual([true, true, true]);
    expect(proxy.requests.total - before).toBe(2); // one read (and its one retry) for the three
    // Not kept: once the endpoint answers, the code is read again and answered to every asker.
    proxy.configure({});
    const answers = await Promise.all([1, 2].map(() => watchRpc(() => signer.getCode({ address }))));
    expect(answers.map((r) => [r.failed, r.value])).toEqual([
      [false, undefined],
      [false, undefined],
    ]);
  } finally {
    proxy.configure({});
    signer.stop();
  }
});
