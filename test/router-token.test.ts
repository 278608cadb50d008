// A facilitator's own port (issue 32, hole 6): a caller that reaches it directly must not settle
// past the router's API keys, quotas and gas budgets, nor send the router-only headers itself.
// Judged on chain: the signer's pending nonce and the receiver's balance. The devnet wires a
// router token itself (its router sends it, its facilitators require it); the rotation runs the
// documented procedure on that file while the devnet's router keeps settling.
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Address } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { pino } from "pino";
import { devnetRouterTokenFile, type RunningDevnet } from "../services/devnet/devnet.ts";
import { FLEET_HEADERS } from "../services/platform/http.ts";
import { ROUTER_TOKEN_MIN_LENGTH, parseRouterTokens, routerTokenDigests, watchRouterToken, watchRouterTokens } from "../services/platform/router-token.ts";
import { routerOptionsFrom } from "../services/router/config.ts";
import { startTestDevnet } from "./helpers/devnet.ts";
import { balanceOf } from "./helpers/chain.ts";
import { nonceOf } from "./helpers/onchain.ts";
import { postJson, serviceShape, signEip3009 } from "./helpers/payments.ts";
import { startRig, stopRig, type Rig } from "./helpers/settlement-rig.ts";
import { until } from "./helpers/wait.ts";

let devnet: RunningDevnet & { dir: string };
let rig: Rig | undefined;
let amount = 1000n;

beforeAll(async () => {
  devnet = await startTestDevnet(["eip155:8453"], { hub: false, wallets: false });
});

afterAll(async () => {
  await stopRig(rig);
  await devnet?.stop();
});

const net = () => devnet.info.networks[0]!;
const receiver = () => devnet.info.receivers[0]!.address;
const usdc = () => net().assets.find((a) => a.transferMethods.includes("eip3009"))!;
const tokenFile = () => devnetRouterTokenFile(devnet.dir);

/** A fresh payment of the devnet's first payer (a new amount, so a new nonce and digest). */
async function payment() {
  const spec = { network: net().network, chainId: net().chainId, asset: usdc(), payerKey: devnet.info.payers[0]!.privateKey, payTo: receiver(), amount: amount++ };
  return serviceShape(spec, await signEip3009(spec));
}

/** What the chain says: the receiver's USDC and the facilitator signer's pending nonce. */
async function chainState() {
  return {
    received: await balanceOf(net().rpcUrl, usdc().address, receiver()),
    nonce: await nonceOf(net().rpcUrl, net().signers[0]! as Address, "pending"),
  };
}

/** A settle the router would route but the facilitator refuses as invalid: 401 until the token is accepted, then 400. Nothing is ever sent. */
const probe = (url: string, token?: string) =>
  postJson(`${url}/settle`, { x402Version: 2, paymentPayload: { x402Version: 2, accepted: { scheme: "exact", network: net().network }, payload: {} }, paymentRequirements: { scheme: "exact", network: net().network } }, { headers: token ? { [FLEET_HEADERS.routerToken]: token } : {} });

describe("a facilitator's own port settles only for its router", () => {
  it("a direct /settle without the token, with a wrong one or with its digest is refused 401, nothing sent; forged router-only headers change nothing", async () => {
    const token = parseRouterTokens(await readFile(tokenFile(), "utf8"))[0]!.token!;
    const before = await chainState();
    const attempts: Record<string, string>[] = [
      {},
      { [FLEET_HEADERS.gasAllowance]: "unlimited" },
      { [FLEET_HEADERS.routerToken]: randomBytes(32).toString("hex"), [FLEET_HEADERS.gasAllowance]: "unlimited" },
      { [FLEET_HEADERS.routerToken]: routerTokenDigests(token)[0]! },
      { [FLEET_HEADERS.routerToken]: token.slice(0, -1) },
      { authorization: `Bearer ${token}` }, // the caller's Authorization is the receiver's, never the router's
    ];
    for (const headers of attempts) {
      const r = await postJson(`${net().facilitatorUrl}/settle`, await payment(), { headers });
      expect(r.status, JSON.stringify(headers)).toBe(401);
      expect(String(r.json.error)).toMatch(/^router_token_required: this facilitator settles only for its router/);
      expect(r.text).not.toContain(token);
    }
    expect(await chainState()).toEqual(before);
    // verify spends no gas: it stays open, and a forged allowance beside it is nothing
    const verified = await postJson(`${net().facilitatorUrl}/verify`, await payment(), { headers: { [FLEET_HEADERS.gasAllowance]: "0" } });
    expect(verified.json).toMatchObject({ isValid: true });
  });

  it("with the token it settles; an allowance is then required and binds", async () => {
    const token = parseRouterTokens(await readFile(tokenFile(), "utf8"))[0]!.token!;
    const router = { [FLEET_HEADERS.routerToken]: token };
    const before = await chainState();
    // the router's token without an allowance: never "no limit"
    const bare = await postJson(`${net().facilitatorUrl}/settle`, await payment(), { headers: router });
    expect(bare.status).toBe(400);
    expect(String(bare.json.error)).toMatch(/^gas_allowance_required: /);
    // an allowance below one transaction's worst case: nothing is signed
    const poor = await postJson(`${net().facilitatorUrl}/settle`, await payment(), { headers: { ...router, [FLEET_HEADERS.gasAllowance]: "1" } });
    expect(poor.json).toMatchObject({ success: false, errorReason: "gas_budget_exhausted", transaction: "" });
    expect(await chainState()).toEqual(before);

    const body = await payment();
    const paid = await postJson(`${net().facilitatorUrl}/settle`, body, { headers: { ...router, [FLEET_HEADERS.gasAllowance]: "unlimited" } });
    expect(paid.json).toMatchObject({ success: true });
    expect(await chainState()).toEqual({ received: before.received + BigInt(body.paymentRequirements.maxAmountRequired), nonce: before.nonce + 1 });
  });

  it("the router's forwarded settle works", async () => {
    const before = await chainState();
    const body = await payment();
    const paid = await postJson(`${devnet.info.routerUrl}/settle`, body);
    expect(paid.json).toMatchObject({ success: true });
    expect(await chainState()).toEqual({ received: before.received + BigInt(body.paymentRequirements.maxAmountRequired), nonce: before.nonce + 1 });
  });

  it("rotation: both tokens of the file are accepted, the router moves to the first, the dropped one is refused", async () => {
    const old = parseRouterTokens(await readFile(tokenFile(), "utf8"))[0]!.token!;
    const fresh = randomBytes(32).toString("hex");
    // 1. The new token as a second line: the facilitators accept it, the router still sends the old one.
    await writeFile(tokenFile(), `${old}\n${fresh}\n`);
    await until(async () => ((await probe(net().facilitatorUrl, fresh)).status === 400 ? true : undefined), "the facilitator accepts the new token");
    expect((await probe(net().facilitatorUrl, old)).status).toBe(400);
    // 2. The new token first: the router switches (both are accepted meanwhile, so no call fails).
    await writeFile(tokenFile(), `# rotated\n${fresh}\n${old}\n`);
    // 3. The old line dropped: refused at the facilitator; the router, once it re-read the file, settles with the new one.
    await writeFile(tokenFile(), `${fresh}\n`);
    await until(async () => ((await probe(net().facilitatorUrl, old)).status === 401 ? true : undefined), "the old token refused");
    await until(async () => ((await probe(devnet.info.routerUrl)).status === 400 ? true : undefined), "the router sends the new token");
    const before = await chainState();
    const body = await payment();
    const paid = await postJson(`${devnet.info.routerUrl}/settle`, body);
    expect(paid.json).toMatchObject({ success: true });
    expect(await chainState()).toEqual({ received: before.received + BigInt(body.paymentRequirements.maxAmountRequired), nonce: before.nonce + 1 });
  });
});

describe("a lone facilitator (no token configured)", () => {
  it("settles for anyone as before, and ignores a forged gas allowance", async () => {
    rig = await startRig();
    const f = await rig.facilitator();
    const signer = privateKeyToAccount(rig.signerKeys[0]!).address;
    const before = { nonce: await nonceOf(rig.anvil.rpcUrl, signer, "pending"), received: await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver) };
    // were "1" trusted, nothing could be signed (gas_budget_exhausted)
    const r = await postJson(`${f.url}/settle`, await rig.payment(4242n), { headers: { [FLEET_HEADERS.gasAllowance]: "1" } });
    expect(r.json).toMatchObject({ success: true });
    expect(r.headers.get(FLEET_HEADERS.gasSpent)).toBeNull(); // it answers a router only
    expect({ nonce: await nonceOf(rig.anvil.rpcUrl, signer, "pending"), received: await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver) }).toEqual({ nonce: before.nonce + 1, received: before.received + 4242n });
  });
});

describe("the router token file", () => {
  it("takes tokens of at least 32 visible characters and sha256 digests, # comments; never echoes a bad line", () => {
    const token = "a".repeat(ROUTER_TOKEN_MIN_LENGTH);
    const [digest] = routerTokenDigests(token);
    expect(digest).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(parseRouterTokens(`# router\n${token}\n\n${digest}\n`).map((e) => Boolean(e.token))).toEqual([true, false]);
    const secretish = "hunter2-but-short";
    expect(() => parseRouterTokens(`${token}\n${secretish}\n`)).toThrow(/line 2 is neither a token/);
    expect(() => parseRouterTokens(`${token}\n${secretish}\n`)).not.toThrow(new RegExp(secretish));
    expect(() => parseRouterTokens("# nothing\n")).toThrow(/no token/);
  });

  it("both sides re-read it: the router sends the first line, a facilitator accepts every line; a broken edit keeps the last good list", async () => {
    const dir = await mkdtemp(join(tmpdir(), "x402-router-token-"));
    const file = join(dir, "tokens");
    const [a, b] = [randomBytes(32).toString("hex"), randomBytes(32).toString("hex")];
    const errors: string[] = [];
    const logger = pino({ level: "info" }, { write: (line: string) => void (JSON.parse(line).level >= 50 && errors.push(line)) });
    await writeFile(file, `${a}\n`);
    const router = watchRouterToken(file, logger, 20);
    const facilitator = watchRouterTokens(file, logger, 20);
    try {
      expect([router.current(), facilitator.accepts(a), facilitator.accepts(b), facilitator.accepts(undefined)]).toEqual([a, true, false, false]);
      await writeFile(file, `${a}\n${b}\n`); // 1. added: accepted, the router keeps sending a
      await until(() => facilitator.accepts(b) || undefined, "b accepted");
      expect(router.current()).toBe(a);
      await writeFile(file, `${b}\n${a}\n`); // 2. moved first: the router sends b, a still accepted
      await until(() => router.current() === b || undefined, "the router sends b");
      expect(facilitator.accepts(a)).toBe(true);
      await writeFile(file, `${b}\n`); // 3. dropped
      await until(() => !facilitator.accepts(a) || undefined, "a refused");
      await writeFile(file, `${routerTokenDigests(b)[0]}\nshort\n`); // broken for both
      await until(() => errors.length >= 2 || undefined, "both reloads refused");
      expect([router.current(), facilitator.accepts(b)]).toEqual([b, true]);
      expect(errors.join("")).not.toContain(b);
    } finally {
      router.close();
      facilitator.close();
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("a router with API keys required refuses to start without X402_ROUTER_TOKEN_FILE", () => {
    const env = { X402_ROUTING_TABLE: "/dev/null", X402_ROUTER_API_KEYS: "required", DATABASE_URL: "postgres://x@127.0.0.1/x" };
    expect(() => routerOptionsFrom({}, env)).toThrow(/X402_ROUTER_API_KEYS=required needs X402_ROUTER_TOKEN_FILE/);
    expect(routerOptionsFrom({}, { ...env, X402_ROUTER_TOKEN_FILE: "/run/token" }).routerTokenFile).toBe("/run/token");
  });
});
