// The devnet's own contracts on a real anvil: EIP-3009 / EIP-2612 stablecoin, Permit2-only token,
// genuine Permit2 patched for the chain, Multicall3 and the exact Permit2 proxy stand-in, including
// the reference @x402/evm client and facilitator running against them end to end.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  BaseError,
  ContractFunctionRevertedError,
  concat,
  createPublicClient,
  createTestClient,
  createWalletClient,
  decodeEventLog,
  defineChain,
  encodeFunctionData,
  encodeAbiParameters,
  erc20Abi,
  hashTypedData,
  http,
  keccak256,
  maxUint256,
  numberToHex,
  parseAbi,
  parseSignature,
  publicActions,
  toHex,
  type Abi,
  type AbiItem,
  type Address,
  type Hex,
  type TransactionReceipt,
} from "viem";
import { formatAbiItem, formatAbiParams } from "viem/utils";
import { generatePrivateKey, privateKeyToAccount, type PrivateKeyAccount } from "viem/accounts";
import {
  authorizationTypes,
  eip3009ABI,
  permit2WitnessTypes,
  toClientEvmSigner,
  toFacilitatorEvmSigner,
  x402ExactPermit2ProxyABI,
  type FacilitatorEvmSigner,
} from "@x402/evm";
import { ExactEvmScheme as ExactEvmClientScheme } from "@x402/evm/exact/client";
import { ExactEvmScheme as ExactEvmFacilitatorScheme } from "@x402/evm/exact/facilitator";
import { startAnvil, type AnvilNode } from "../services/devnet/anvil.ts";
import { compileDevnetContracts, devnetContract, type CompiledContracts } from "../services/devnet/compile.ts";
import { DEVNET_MINTER_ADDRESS, defaultPayerTokenAmount, setupDevnetChain } from "../services/devnet/chain-setup.ts";
import { devnetAssets } from "../services/devnet/devnet-assets.ts";
import { permit2DomainSeparator, permit2RuntimeBytecode } from "../services/devnet/permit2.ts";
import { EXACT_PERMIT2_PROXY_ADDRESS, MULTICALL3_ADDRESS, NETWORKS, PERMIT2_ADDRESS, type AssetInfo } from "../services/x402/networks.ts";

const CHAIN_ID = 8453;
const MINTER_KEY: Hex = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"; // anvil #0
const RELAYER_KEY: Hex = "0x7c852118294e51e653712a81e05800f419141751be58f605c371e15141b007a6"; // anvil #3
const SECP256K1_N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n;

function networkAssets(chainId: number): AssetInfo[] {
  const n = NETWORKS.find((x) => x.chainId === chainId);
  if (!n) throw new Error(`no network ${chainId}`);
  return n.assets;
}
const baseAssets = networkAssets(8453);
const bscAssets = devnetAssets("eip155:56"); // the real BSC tokens plus the devnet's EIP-3009 stand-in
const USDC = baseAssets[0]!; // EIP-3009 stablecoin, "USD Coin"/"2", 6 decimals
const USDT = bscAssets.find((a) => a.symbol === "USDT")!; // Permit2-only, 18 decimals
const USDC_BSC = bscAssets.find((a) => a.transferMethods.includes("eip3009"))!; // the devnet-only stand-in

const chain = defineChain({
  id: CHAIN_ID,
  name: "devnet-8453",
  nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 },
  rpcUrls: { default: { http: [] } },
  contracts: { multicall3: { address: MULTICALL3_ADDRESS } },
});

const receiveTypes = { ReceiveWithAuthorization: authorizationTypes.TransferWithAuthorization };
const cancelTypes = {
  CancelAuthorization: [
    { name: "authorizer", type: "address" },
    { name: "nonce", type: "bytes32" },
  ],
} as const;
const permitTypes = {
  Permit: [
    { name: "owner", type: "address" },
    { name: "spender", type: "address" },
    { name: "value", type: "uint256" },
    { name: "nonce", type: "uint256" },
    { name: "deadline", type: "uint256" },
  ],
} as const;
// Errors of the genuine Permit2 (published interface), so reverts decode by name.
// The deployed proxy's events for a failed EIP-2612 permit (a fact of its source; the published ABI
// leaves them out): a failed permit is reported, not reverted.
const permitFailedFacts = parseAbi([
  "event EIP2612PermitFailedWithReason(address indexed token, address indexed owner, string reason)",
  "event EIP2612PermitFailedWithPanic(address indexed token, address indexed owner, uint256 errorCode)",
  "event EIP2612PermitFailedWithData(address indexed token, address indexed owner, bytes data)",
]);
const permit2ErrorsAbi = parseAbi([
  "error InvalidSigner()",
  "error InvalidNonce()",
  "error InvalidSignature()",
  "error SignatureExpired(uint256 signatureDeadline)",
  "function DOMAIN_SEPARATOR() view returns (bytes32)",
]);

let anvil: AnvilNode;
let contracts: CompiledContracts;
let stableAbi: Abi;
let tokenAbi: Abi;
let proxyAbi: Abi;
// The tokens' events as USDC and every ERC-20 show them (EIP-3009 and ERC-20 facts), never our stand-ins' ABI.
const tokenEventFacts: Abi = [
  ...erc20Abi.filter((i) => i.type === "event"),
  ...parseAbi(["event AuthorizationUsed(address indexed authorizer, bytes32 indexed nonce)", "event AuthorizationCanceled(address indexed authorizer, bytes32 indexed nonce)"]),
];
let multicallAbi: Abi;
let publicClient: ReturnType<typeof makePublicClient>;
let relayerWallet: ReturnType<typeof makeWallet>;
let minterWallet: ReturnType<typeof makeWallet>;
const relayer = privateKeyToAccount(RELAYER_KEY);
const PAYER_A_KEY = generatePrivateKey();
const PAYER_B_KEY = generatePrivateKey();
const payerA = privateKeyToAccount(PAYER_A_KEY); // approved Permit2 at setup
const payerB = privateKeyToAccount(PAYER_B_KEY); // no Permit2 allowance
const merchant = privateKeyToAccount(generatePrivateKey()).address;

function makePublicClient(rpcUrl: string) {
  return createPublicClient({ chain, transport: http(rpcUrl, { retryCount: 0 }), pollingInterval: 20 });
}

function makeWallet(rpcUrl: string, account: PrivateKeyAccount) {
  return createWalletClient({ account, chain, transport: http(rpcUrl, { retryCount: 0 }), pollingInterval: 20 }).extend(publicActions);
}

/** Runs `p`, expects a revert and returns its reason string or custom error name. */
async function revertOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (e) {
    if (e instanceof BaseError) {
      const r = e.walk((x) => x instanceof ContractFunctionRevertedError);
      if (r instanceof ContractFunctionRevertedError) {
        if (r.data?.errorName === "Error") return r.reason ?? "";
        return r.data?.errorName ?? r.reason ?? r.signature ?? "unknown revert";
      }
    }
    throw e;
  }
  throw new Error("expected a revert, but the call succeeded");
}

async function now(): Promise<bigint> {
  return (await publicClient.getBlock()).timestamp;
}

function randomNonce(): Hex {
  return generatePrivateKey(); // 32 random bytes
}

async function balanceOf(token: Address, who: Address): Promise<bigint> {
  return (await publicClient.readContract({ address: token, abi: tokenAbi, functionName: "balanceOf", args: [who] })) as bigint;
}

async function send(
  wallet: ReturnType<typeof makeWallet>,
  address: Address,
  abi: Abi,
  functionName: string,
  args: readonly unknown[],
): Promise<TransactionReceipt> {
  const hash = await wallet.writeContract({ address, abi, functionName, args, chain, account: wallet.account });
  const receipt = await publicClient.waitForTransactionReceipt({ hash });
  expect(receipt.status).toBe("success");
  return receipt;
}

function simulate(address: Address, abi: Abi, functionName: string, args: readonly unknown[], from: Address = relayer.address) {
  return publicClient.simulateContract({ address, abi, functionName, args, account: from });
}

function eventNames(receipt: TransactionReceipt, address: Address, abi: Abi): string[] {
  return receipt.logs
    .filter((l) => l.address.toLowerCase() === address.toLowerCase())
    .map((l) => decodeEventLog({ abi, data: l.data, topics: l.topics }).eventName ?? "");
}

interface Authorization {
  from: Address;
  to: Address;
  value: bigint;
  validAfter: bigint;
  validBefore: bigint;
  nonce: Hex;
}

function usdcDomain(asset: AssetInfo = USDC) {
  return { name: asset.eip712!.name, version: asset.eip712!.version, chainId: CHAIN_ID, verifyingContract: asset.address } as const;
}

async function authorization(from: PrivateKeyAccount, value: bigint, overrides: Partial<Authorization> = {}): Promise<Authorization> {
  return {
    from: from.address,
    to: merchant,
    value,
    validAfter: 0n,
    validBefore: (await now()) + 300n,
    nonce: randomNonce(),
    ...overrides,
  };
}

function signTransferAuth(signer: PrivateKeyAccount, auth: Authorization, asset: AssetInfo = USDC): Promise<Hex> {
  return signer.signTypedData({ domain: usdcDomain(asset), types: authorizationTypes, primaryType: "TransferWithAuthorization", message: auth });
}

function authArgs(a: Authorization): readonly unknown[] {
  return [a.from, a.to, a.value, a.validAfter, a.validBefore, a.nonce];
}

function vrs(signature: Hex): readonly [number, Hex, Hex] {
  const { r, s, v } = parseSignature(signature);
  return [Number(v), r, s];
}

async function expectTransferReverts(auth: Authorization, signature: Hex, reason: string): Promise<void> {
  expect(await revertOf(simulate(USDC.address, stableAbi, "transferWithAuthorization", [...authArgs(auth), signature]))).toBe(reason);
  expect(await revertOf(simulate(USDC.address, stableAbi, "transferWithAuthorization", [...authArgs(auth), ...vrs(signature)]))).toBe(reason);
}

interface PermitTransferFrom {
  permitted: { token: Address; amount: bigint };
  nonce: bigint;
  deadline: bigint;
}

async function signPermit2(
  owner: PrivateKeyAccount,
  token: Address,
  amount: bigint,
  witness: { to: Address; validAfter: bigint },
  spender: Address = EXACT_PERMIT2_PROXY_ADDRESS,
): Promise<{ permit: PermitTransferFrom; signature: Hex }> {
  const permit = { permitted: { token, amount }, nonce: BigInt(randomNonce()), deadline: (await now()) + 300n };
  const signature = await owner.signTypedData({
    domain: { name: "Permit2", chainId: CHAIN_ID, verifyingContract: PERMIT2_ADDRESS },
    types: permit2WitnessTypes,
    primaryType: "PermitWitnessTransferFrom",
    message: { ...permit, spender, witness },
  });
  return { permit, signature };
}

async function signEip2612(owner: PrivateKeyAccount, asset: AssetInfo, spender: Address, value: bigint, deadline: bigint): Promise<Hex> {
  const nonce = (await publicClient.readContract({ address: asset.address, abi: stableAbi, functionName: "nonces", args: [owner.address] })) as bigint;
  return owner.signTypedData({
    domain: usdcDomain(asset),
    types: permitTypes,
    primaryType: "Permit",
    message: { owner: owner.address, spender, value, nonce, deadline },
  });
}

/** Canonical `name(types) mutability returns (types)` lines of one kind of ABI item, sorted. */
function signatures(abi: readonly unknown[], type: "function" | "event" | "error"): string[] {
  return (abi as AbiItem[])
    .filter((i) => i.type === type)
    .map((i) => {
      let line = formatAbiItem(i);
      if (i.type === "function") line += ` ${i.stateMutability} returns (${formatAbiParams(i.outputs)})`;
      if (i.type === "event") line += ` ${i.inputs.map((p) => (p.indexed ? "i" : "-")).join("")}`;
      return line;
    })
    .sort();
}

beforeAll(async () => {
  const t0 = Date.now();
  [anvil, contracts] = await Promise.all([startAnvil({ chainId: CHAIN_ID }), compileDevnetContracts()]);
  stableAbi = devnetContract(contracts, "DevnetStablecoin").abi;
  tokenAbi = devnetContract(contracts, "DevnetToken").abi;
  // Decoded with the ABI @x402/evm publishes, never ours: a divergence of the stand-in fails here.
  proxyAbi = [...x402ExactPermit2ProxyABI, ...permit2ErrorsAbi];
  multicallAbi = devnetContract(contracts, "DevnetMulticall3").abi;
  publicClient = makePublicClient(anvil.rpcUrl);
  relayerWallet = makeWallet(anvil.rpcUrl, relayer);
  minterWallet = makeWallet(anvil.rpcUrl, privateKeyToAccount(MINTER_KEY));
  const t1 = Date.now();
  await setupDevnetChain({
    rpcUrl: anvil.rpcUrl,
    chainId: CHAIN_ID,
    assets: [...baseAssets, ...bscAssets],
    gasFunded: [relayer.address],
    payers: [
      { privateKey: PAYER_A_KEY, permit2Approved: true },
      { privateKey: PAYER_B_KEY, permit2Approved: false },
    ],
  });
  console.log(`devnet: anvil + compile ${t1 - t0} ms, setupDevnetChain ${Date.now() - t1} ms`);
});

afterAll(async () => {
  await anvil?.stop();
});

describe("setup and interfaces", () => {
  it("places genuine Permit2 patched for the chain; DOMAIN_SEPARATOR matches the off-chain value", async () => {
    expect(await publicClient.getCode({ address: PERMIT2_ADDRESS })).toBe(permit2RuntimeBytecode(CHAIN_ID));
    const separator = await publicClient.readContract({ address: PERMIT2_ADDRESS, abi: permit2ErrorsAbi, functionName: "DOMAIN_SEPARATOR" });
    expect(separator).toBe(permit2DomainSeparator(CHAIN_ID));
    expect(permit2DomainSeparator(56)).not.toBe(permit2DomainSeparator(CHAIN_ID));
    // only the two immutable words differ between chains
    const a = permit2RuntimeBytecode(56);
    const b = permit2RuntimeBytecode(CHAIN_ID);
    expect(a.length).toBe(b.length);
    expect(a.slice(0, 2 + 6945 * 2)).toBe(b.slice(0, 2 + 6945 * 2));
    expect(a.slice(2 + (6983 + 32) * 2)).toBe(b.slice(2 + (6983 + 32) * 2));
  });

  it("exact proxy implements exactly x402ExactPermit2ProxyABI, plus the deployed proxy's permit-failure events", async () => {
    const ours = devnetContract(contracts, "DevnetExactPermit2Proxy").abi;
    for (const type of ["function", "event", "error"] as const) {
      expect(signatures(ours, type)).toEqual(signatures([...x402ExactPermit2ProxyABI, ...permitFailedFacts], type));
    }
    expect(await publicClient.readContract({ address: EXACT_PERMIT2_PROXY_ADDRESS, abi: proxyAbi, functionName: "PERMIT2" })).toBe(PERMIT2_ADDRESS);
    expect(await publicClient.readContract({ address: EXACT_PERMIT2_PROXY_ADDRESS, abi: proxyAbi, functionName: "WITNESS_TYPEHASH" })).toBe(
      keccak256(toHex("Witness(address to,uint256 validAfter)")),
    );
    expect(await publicClient.readContract({ address: EXACT_PERMIT2_PROXY_ADDRESS, abi: proxyAbi, functionName: "WITNESS_TYPE_STRING" })).toBe(
      "Witness witness)TokenPermissions(address token,uint256 amount)Witness(address to,uint256 validAfter)",
    );
  });

  it("stablecoin carries the reference EIP-3009 ABI; the Permit2-only token has neither EIP-3009 nor permit", () => {
    const stable = signatures(stableAbi, "function");
    for (const f of signatures(eip3009ABI, "function")) expect(stable).toContain(f);
    for (const f of [
      "receiveWithAuthorization(address,address,uint256,uint256,uint256,bytes32,uint8,bytes32,bytes32) nonpayable returns ()",
      "receiveWithAuthorization(address,address,uint256,uint256,uint256,bytes32,bytes) nonpayable returns ()",
      "cancelAuthorization(address,bytes32,uint8,bytes32,bytes32) nonpayable returns ()",
      "cancelAuthorization(address,bytes32,bytes) nonpayable returns ()",
      "permit(address,address,uint256,uint256,uint8,bytes32,bytes32) nonpayable returns ()",
      "DOMAIN_SEPARATOR() view returns (bytes32)",
      "nonces(address) view returns (uint256)",
    ]) {
      expect(stable).toContain(f);
    }
    const plain = signatures(tokenAbi, "function").join("\n");
    expect(plain).not.toMatch(/WithAuthorization|permit|version|DOMAIN_SEPARATOR/);
  });

  it("initialises tokens, mints to payers, approves Permit2 only for approved payers", async () => {
    const read = (address: Address, abi: Abi, functionName: string, args: unknown[] = []) => publicClient.readContract({ address, abi, functionName, args });
    expect(await read(USDC.address, stableAbi, "name")).toBe("USD Coin");
    expect(await read(USDC.address, stableAbi, "version")).toBe("2");
    expect(await read(USDC.address, stableAbi, "decimals")).toBe(6);
    expect(await read(USDC.address, stableAbi, "minter")).toBe(DEVNET_MINTER_ADDRESS);
    expect(await read(USDT.address, tokenAbi, "decimals")).toBe(18);
    expect(await read(USDT.address, tokenAbi, "symbol")).toBe("USDT");
    expect(await read(USDC.address, stableAbi, "DOMAIN_SEPARATOR")).toBe(
      keccak256(
        encodeAbiParameters(
          [{ type: "bytes32" }, { type: "bytes32" }, { type: "bytes32" }, { type: "uint256" }, { type: "address" }],
          [
            keccak256(toHex("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)")),
            keccak256(toHex("USD Coin")),
            keccak256(toHex("2")),
            BigInt(CHAIN_ID),
            USDC.address,
          ],
        ),
      ),
    );
    for (const asset of [USDC, USDT, USDC_BSC]) {
      expect(await balanceOf(asset.address, payerA.address)).toBe(defaultPayerTokenAmount(asset));
      expect(await read(asset.address, tokenAbi, "allowance", [payerA.address, PERMIT2_ADDRESS])).toBe(maxUint256);
      expect(await read(asset.address, tokenAbi, "allowance", [payerB.address, PERMIT2_ADDRESS])).toBe(0n);
    }
    expect(defaultPayerTokenAmount(USDT)).toBe(1_000_000n * 10n ** 18n);
    expect(await publicClient.getBalance({ address: relayer.address })).toBe(1000n * 10n ** 18n);
  });

  it("initialize is callable once; mint only by the minter", async () => {
    expect(await revertOf(simulate(USDC.address, stableAbi, "initialize", ["X", "X", "1", 6, relayer.address]))).toBe("DevnetToken: already initialized");
    expect(await revertOf(simulate(USDT.address, tokenAbi, "initialize", ["X", "X", "1", 18, relayer.address]))).toBe("DevnetToken: already initialized");
    expect(await revertOf(simulate(USDC.address, stableAbi, "mint", [relayer.address, 1n]))).toBe("DevnetToken: caller is not the minter");
    expect(await revertOf(simulate(USDT.address, tokenAbi, "mint", [relayer.address, 1n]))).toBe("DevnetToken: caller is not the minter");
    const before = await balanceOf(USDT.address, relayer.address);
    await send(minterWallet, USDT.address, tokenAbi, "mint", [relayer.address, 5n]);
    expect(await balanceOf(USDT.address, relayer.address)).toBe(before + 5n);
  });
});

describe("EIP-3009", () => {
  it("transferWithAuthorization (v,r,s form) moves the value and marks the nonce used", async () => {
    const auth = await authorization(payerA, 1_250_000n);
    const signature = await signTransferAuth(payerA, auth);
    const [fromBefore, toBefore] = [await balanceOf(USDC.address, payerA.address), await balanceOf(USDC.address, merchant)];
    const receipt = await send(relayerWallet, USDC.address, stableAbi, "transferWithAuthorization", [...authArgs(auth), ...vrs(signature)]);
    expect(eventNames(receipt, USDC.address, tokenEventFacts)).toEqual(["AuthorizationUsed", "Transfer"]);
    expect(await balanceOf(USDC.address, payerA.address)).toBe(fromBefore - auth.value);
    expect(await balanceOf(USDC.address, merchant)).toBe(toBefore + auth.value);
    expect(await publicClient.readContract({ address: USDC.address, abi: stableAbi, functionName: "authorizationState", args: [payerA.address, auth.nonce] })).toBe(true);
  });

  it("transferWithAuthorization (bytes signature form) on another chain's stablecoin deployment", async () => {
    const auth = await authorization(payerA, 42n);
    const signature = await signTransferAuth(payerA, auth, USDC_BSC);
    const before = await balanceOf(USDC_BSC.address, merchant);
    await send(relayerWallet, USDC_BSC.address, stableAbi, "transferWithAuthorization", [...authArgs(auth), signature]);
    expect(await balanceOf(USDC_BSC.address, merchant)).toBe(before + 42n);
    // the same signature is bound to the domain: not valid on the other stablecoin
    expect(await revertOf(simulate(USDC.address, stableAbi, "transferWithAuthorization", [...authArgs({ ...auth, nonce: auth.nonce }), signature]))).toBe(
      "FiatTokenV2: invalid signature",
    );
  });

  it("receiveWithAuthorization by the payee, both forms; rejected for anyone else", async () => {
    for (const form of ["vrs", "bytes"] as const) {
      const auth = await authorization(payerA, 7n, { to: relayer.address });
      const signature = await payerA.signTypedData({ domain: usdcDomain(), types: receiveTypes, primaryType: "ReceiveWithAuthorization", message: auth });
      const sigArgs = form === "vrs" ? vrs(signature) : [signature];
      // a TransferWithAuthorization signature is not a ReceiveWithAuthorization one
      const transferSig = await signTransferAuth(payerA, auth);
      expect(await revertOf(simulate(USDC.address, stableAbi, "receiveWithAuthorization", [...authArgs(auth), transferSig]))).toBe("FiatTokenV2: invalid signature");
      expect(await revertOf(simulate(USDC.address, stableAbi, "receiveWithAuthorization", [...authArgs(auth), ...sigArgs], payerB.address))).toBe(
        "FiatTokenV2: caller must be the payee",
      );
      const before = await balanceOf(USDC.address, relayer.address);
      await send(relayerWallet, USDC.address, stableAbi, "receiveWithAuthorization", [...authArgs(auth), ...sigArgs]);
      expect(await balanceOf(USDC.address, relayer.address)).toBe(before + 7n);
    }
  });

  it("cancelAuthorization (both forms) burns the nonce", async () => {
    for (const form of ["vrs", "bytes"] as const) {
      const auth = await authorization(payerA, 1n);
      const cancelSig = await payerA.signTypedData({
        domain: usdcDomain(),
        types: cancelTypes,
        primaryType: "CancelAuthorization",
        message: { authorizer: payerA.address, nonce: auth.nonce },
      });
      const sigArgs = form === "vrs" ? vrs(cancelSig) : [cancelSig];
      // someone else's cancellation signature is rejected
      const foreign = await payerB.signTypedData({
        domain: usdcDomain(),
        types: cancelTypes,
        primaryType: "CancelAuthorization",
        message: { authorizer: payerA.address, nonce: auth.nonce },
      });
      expect(await revertOf(simulate(USDC.address, stableAbi, "cancelAuthorization", [payerA.address, auth.nonce, foreign]))).toBe("FiatTokenV2: invalid signature");
      const receipt = await send(relayerWallet, USDC.address, stableAbi, "cancelAuthorization", [payerA.address, auth.nonce, ...sigArgs]);
      expect(eventNames(receipt, USDC.address, tokenEventFacts)).toEqual(["AuthorizationCanceled"]);
      expect(await publicClient.readContract({ address: USDC.address, abi: stableAbi, functionName: "authorizationState", args: [payerA.address, auth.nonce] })).toBe(true);
      await expectTransferReverts(auth, await signTransferAuth(payerA, auth), "FiatTokenV2: authorization is used or canceled");
      expect(await revertOf(simulate(USDC.address, stableAbi, "cancelAuthorization", [payerA.address, auth.nonce, cancelSig]))).toBe(
        "FiatTokenV2: authorization is used or canceled",
      );
    }
  });

  it("rejects expired, not yet valid and reused authorizations", async () => {
    const t = await now();
    const expired = await authorization(payerA, 1n, { validBefore: t - 1n });
    await expectTransferReverts(expired, await signTransferAuth(payerA, expired), "FiatTokenV2: authorization is expired");
    const early = await authorization(payerA, 1n, { validAfter: t + 3600n, validBefore: t + 7200n });
    await expectTransferReverts(early, await signTransferAuth(payerA, early), "FiatTokenV2: authorization is not yet valid");

    const used = await authorization(payerA, 3n);
    const sig = await signTransferAuth(payerA, used);
    await send(relayerWallet, USDC.address, stableAbi, "transferWithAuthorization", [...authArgs(used), sig]);
    await expectTransferReverts(used, sig, "FiatTokenV2: authorization is used or canceled");
  });

  it("rejects a wrong signer and a tampered message", async () => {
    const auth = await authorization(payerA, 10n);
    await expectTransferReverts(auth, await signTransferAuth(payerB, auth), "FiatTokenV2: invalid signature");
    const sig = await signTransferAuth(payerA, auth);
    await expectTransferReverts({ ...auth, value: 11n }, sig, "FiatTokenV2: invalid signature");
    await expectTransferReverts({ ...auth, to: relayer.address }, sig, "FiatTokenV2: invalid signature");
    // malformed bytes signature
    expect(await revertOf(simulate(USDC.address, stableAbi, "transferWithAuthorization", [...authArgs(auth), "0x1234"]))).toBe("FiatTokenV2: invalid signature");
    expect(await revertOf(simulate(USDC.address, stableAbi, "transferWithAuthorization", [...authArgs(auth), concat([sig, "0x00"])]))).toBe(
      "FiatTokenV2: invalid signature",
    );
    // the untouched authorization is still good
    await send(relayerWallet, USDC.address, stableAbi, "transferWithAuthorization", [...authArgs(auth), sig]);
  });

  it("rejects high-s (malleable) signatures that ecrecover would accept, and v other than 27/28", async () => {
    const auth = await authorization(payerA, 5n);
    const sig = await signTransferAuth(payerA, auth);
    const { r, s, v } = parseSignature(sig);
    const highS = numberToHex(SECP256K1_N - BigInt(s), { size: 32 });
    const flippedV = v === 27n ? 28 : 27;
    // sanity: the malleated signature recovers the payer through the ecrecover precompile
    const digest = hashTypedData({ domain: usdcDomain(), types: authorizationTypes, primaryType: "TransferWithAuthorization", message: auth });
    const recovered = await publicClient.call({
      to: "0x0000000000000000000000000000000000000001",
      data: encodeAbiParameters([{ type: "bytes32" }, { type: "uint8" }, { type: "bytes32" }, { type: "bytes32" }], [digest, flippedV, r, highS]),
    });
    expect(recovered.data?.toLowerCase()).toBe(encodeAbiParameters([{ type: "address" }], [payerA.address]).toLowerCase());
    await expectTransferReverts(auth, concat([r, highS, numberToHex(flippedV, { size: 1 })]), "FiatTokenV2: invalid signature");

    for (const badV of [0, 1, 29]) {
      expect(await revertOf(simulate(USDC.address, stableAbi, "transferWithAuthorization", [...authArgs(auth), badV, r, s]))).toBe("FiatTokenV2: invalid signature");
      expect(await revertOf(simulate(USDC.address, stableAbi, "transferWithAuthorization", [...authArgs(auth), concat([r, s, numberToHex(badV, { size: 1 })])]))).toBe(
        "FiatTokenV2: invalid signature",
      );
    }
    // a zero signature recovers address(0), which must never match from = address(0)
    const zeroFrom = { ...auth, from: "0x0000000000000000000000000000000000000000" as Address };
    expect(await revertOf(simulate(USDC.address, stableAbi, "transferWithAuthorization", [...authArgs(zeroFrom), 27, numberToHex(0, { size: 32 }), numberToHex(0, { size: 32 })]))).toBe(
      "FiatTokenV2: invalid signature",
    );
  });

  it("rejects a transfer beyond the balance with the ERC-20 message", async () => {
    const poor = privateKeyToAccount(generatePrivateKey());
    const auth = await authorization(poor, 1n);
    await expectTransferReverts(auth, await signTransferAuth(poor, auth), "ERC20: transfer amount exceeds balance");
    const big = await authorization(payerA, defaultPayerTokenAmount(USDC) * 2n);
    await expectTransferReverts(big, await signTransferAuth(payerA, big), "ERC20: transfer amount exceeds balance");
  });

  it("uses ERC-1271 for accounts with code", async () => {
    const testClient = createTestClient({ mode: "anvil", chain, transport: http(anvil.rpcUrl, { retryCount: 0 }) });
    // return bytes32(0x1626ba7e << 224) for any call; and a wallet that always answers 0
    const acceptAll = privateKeyToAccount(generatePrivateKey()).address;
    const rejectAll = privateKeyToAccount(generatePrivateKey()).address;
    await testClient.setCode({ address: acceptAll, bytecode: "0x631626ba7e60e01b60005260206000f3" });
    await testClient.setCode({ address: rejectAll, bytecode: "0x60206000f3" });
    await send(minterWallet, USDC.address, stableAbi, "mint", [acceptAll, 100n]);
    await send(minterWallet, USDC.address, stableAbi, "mint", [rejectAll, 100n]);

    const ok = await authorization(payerA, 60n, { from: acceptAll });
    const before = await balanceOf(USDC.address, merchant);
    await send(relayerWallet, USDC.address, stableAbi, "transferWithAuthorization", [...authArgs(ok), "0xdeadbeef"]);
    expect(await balanceOf(USDC.address, merchant)).toBe(before + 60n);
    expect(await balanceOf(USDC.address, acceptAll)).toBe(40n);

    const bad = await authorization(payerA, 1n, { from: rejectAll });
    // even a real ECDSA signature from some key does not help: the wallet decides
    await expectTransferReverts(bad, await signTransferAuth(payerA, bad), "FiatTokenV2: invalid signature");
  });
});

describe("EIP-2612", () => {
  it("permit sets the allowance and consumes the nonce; replay, expiry and wrong signer revert", async () => {
    const deadline = (await now()) + 600n;
    const sig = await signEip2612(payerB, USDC, relayer.address, 500n, deadline);
    expect(await revertOf(simulate(USDC.address, stableAbi, "permit", [payerB.address, relayer.address, 501n, deadline, ...vrs(sig)]))).toBe("EIP2612: invalid signature");
    const nonceBefore = (await publicClient.readContract({ address: USDC.address, abi: stableAbi, functionName: "nonces", args: [payerB.address] })) as bigint;
    const receipt = await send(relayerWallet, USDC.address, stableAbi, "permit", [payerB.address, relayer.address, 500n, deadline, ...vrs(sig)]);
    expect(eventNames(receipt, USDC.address, tokenEventFacts)).toEqual(["Approval"]);
    expect(await publicClient.readContract({ address: USDC.address, abi: stableAbi, functionName: "allowance", args: [payerB.address, relayer.address] })).toBe(500n);
    expect(await publicClient.readContract({ address: USDC.address, abi: stableAbi, functionName: "nonces", args: [payerB.address] })).toBe(nonceBefore + 1n);
    expect(await revertOf(simulate(USDC.address, stableAbi, "permit", [payerB.address, relayer.address, 500n, deadline, sig]))).toBe("EIP2612: invalid signature");

    const before = await balanceOf(USDC.address, merchant);
    await send(relayerWallet, USDC.address, stableAbi, "transferFrom", [payerB.address, merchant, 200n]);
    expect(await balanceOf(USDC.address, merchant)).toBe(before + 200n);
    expect(await publicClient.readContract({ address: USDC.address, abi: stableAbi, functionName: "allowance", args: [payerB.address, relayer.address] })).toBe(300n);

    const past = (await now()) - 1n;
    const expiredSig = await signEip2612(payerB, USDC, relayer.address, 1n, past);
    expect(await revertOf(simulate(USDC.address, stableAbi, "permit", [payerB.address, relayer.address, 1n, past, expiredSig]))).toBe("FiatTokenV2: permit is expired");
    const foreign = await signEip2612(payerA, USDC, relayer.address, 1n, deadline);
    expect(await revertOf(simulate(USDC.address, stableAbi, "permit", [payerB.address, relayer.address, 1n, deadline, foreign]))).toBe("EIP2612: invalid signature");
  });
});

describe("Multicall3", () => {
  it("aggregate3 and tryAggregate return per-call results; failures are isolated or bubble as asked", async () => {
    const balanceCall = (token: Address, who: Address) => ({
      target: token,
      callData: encodeFunctionDataFor(tokenAbi, "balanceOf", [who]),
    });
    const failing = { target: USDC.address, callData: encodeFunctionDataFor(stableAbi, "mint", [relayer.address, 1n]) };
    const results = (await publicClient.readContract({
      address: MULTICALL3_ADDRESS,
      abi: multicallAbi,
      functionName: "aggregate3",
      args: [[{ ...balanceCall(USDC.address, payerA.address), allowFailure: false }, { ...failing, allowFailure: true }, { ...balanceCall(USDT.address, payerA.address), allowFailure: false }]],
    })) as { success: boolean; returnData: Hex }[];
    expect(results.map((r) => r.success)).toEqual([true, false, true]);
    expect(BigInt(results[0]!.returnData)).toBe(await balanceOf(USDC.address, payerA.address));
    expect(BigInt(results[2]!.returnData)).toBe(await balanceOf(USDT.address, payerA.address));
    expect(await revertOf(publicClient.readContract({ address: MULTICALL3_ADDRESS, abi: multicallAbi, functionName: "aggregate3", args: [[{ ...failing, allowFailure: false }]] }))).toBe(
      "Multicall3: call failed",
    );

    const tried = (await publicClient.readContract({
      address: MULTICALL3_ADDRESS,
      abi: multicallAbi,
      functionName: "tryAggregate",
      args: [false, [balanceCall(USDT.address, payerB.address), failing]],
    })) as { success: boolean; returnData: Hex }[];
    expect(tried.map((r) => r.success)).toEqual([true, false]);
    expect(BigInt(tried[0]!.returnData)).toBe(defaultPayerTokenAmount(USDT));
    expect(await revertOf(publicClient.readContract({ address: MULTICALL3_ADDRESS, abi: multicallAbi, functionName: "tryAggregate", args: [true, [failing]] }))).toBe(
      "Multicall3: call failed",
    );

    // viem's own multicall goes through aggregate3 at chain.contracts.multicall3
    const viaViem = await publicClient.multicall({
      contracts: [
        { address: USDC.address, abi: eip3009ABI, functionName: "name" },
        { address: USDC.address, abi: eip3009ABI, functionName: "balanceOf", args: [payerB.address] },
      ],
      allowFailure: false,
    });
    expect(viaViem[0]).toBe("USD Coin");
    expect(viaViem[1]).toBe(await balanceOf(USDC.address, payerB.address));

    const block = await publicClient.getBlock();
    expect(await publicClient.readContract({ address: MULTICALL3_ADDRESS, abi: multicallAbi, functionName: "getChainId" })).toBe(BigInt(CHAIN_ID));
    expect(await publicClient.readContract({ address: MULTICALL3_ADDRESS, abi: multicallAbi, functionName: "getEthBalance", args: [relayer.address] })).toBe(
      await publicClient.getBalance({ address: relayer.address }),
    );
    expect(await publicClient.readContract({ address: MULTICALL3_ADDRESS, abi: multicallAbi, functionName: "getBlockHash", args: [block.number - 1n] })).toBe(block.parentHash);
    expect((await publicClient.readContract({ address: MULTICALL3_ADDRESS, abi: multicallAbi, functionName: "getBlockNumber" })) as bigint).toBeGreaterThanOrEqual(block.number);
  });
});

describe("exact Permit2 proxy", () => {
  it("settle moves exactly the permitted amount of the 18-decimal token to witness.to", async () => {
    const amount = 3n * 10n ** 17n;
    const { permit, signature } = await signPermit2(payerA, USDT.address, amount, { to: merchant, validAfter: 0n });
    const [fromBefore, toBefore] = [await balanceOf(USDT.address, payerA.address), await balanceOf(USDT.address, merchant)];
    const receipt = await send(relayerWallet, EXACT_PERMIT2_PROXY_ADDRESS, proxyAbi, "settle", [permit, payerA.address, { to: merchant, validAfter: 0n }, signature]);
    expect(eventNames(receipt, EXACT_PERMIT2_PROXY_ADDRESS, proxyAbi)).toEqual(["Settled"]);
    expect(await balanceOf(USDT.address, payerA.address)).toBe(fromBefore - amount);
    expect(await balanceOf(USDT.address, merchant)).toBe(toBefore + amount);
    // Permit2 nonces are single-use
    expect(await revertOf(simulate(EXACT_PERMIT2_PROXY_ADDRESS, proxyAbi, "settle", [permit, payerA.address, { to: merchant, validAfter: 0n }, signature]))).toBe("InvalidNonce");
  });

  it("settleWithPermit lets a payer without allowance pay with an EIP-2612 permit, also when the permit was front-run", async () => {
    for (const frontRun of [false, true]) {
      const amount = 2_500_000n;
      const witness = { to: merchant, validAfter: 0n };
      const { permit, signature } = await signPermit2(payerB, USDC.address, amount, witness);
      const p2612Sig = await signEip2612(payerB, USDC, PERMIT2_ADDRESS, amount, permit.deadline);
      const [v, r, s] = vrs(p2612Sig);
      const permit2612 = { value: amount, deadline: permit.deadline, r, s, v };
      expect(await publicClient.readContract({ address: USDC.address, abi: stableAbi, functionName: "allowance", args: [payerB.address, PERMIT2_ADDRESS] })).toBe(0n);
      // without the permit the plain settle fails for lack of allowance
      expect(await revertOf(simulate(EXACT_PERMIT2_PROXY_ADDRESS, proxyAbi, "settle", [permit, payerB.address, witness, signature]))).toMatch(/TRANSFER_FROM_FAILED|allowance/);
      if (frontRun) await send(relayerWallet, USDC.address, stableAbi, "permit", [payerB.address, PERMIT2_ADDRESS, amount, permit.deadline, v, r, s]);
      const [fromBefore, toBefore] = [await balanceOf(USDC.address, payerB.address), await balanceOf(USDC.address, merchant)];
      const receipt = await send(relayerWallet, EXACT_PERMIT2_PROXY_ADDRESS, proxyAbi, "settleWithPermit", [permit2612, permit, payerB.address, witness, signature]);
      // a front-run permit (its nonce spent) is reported the deployed proxy's way, and the payment settles
      expect(eventNames(receipt, EXACT_PERMIT2_PROXY_ADDRESS, [...proxyAbi, ...permitFailedFacts])).toEqual(frontRun ? ["EIP2612PermitFailedWithReason", "SettledWithPermit"] : ["SettledWithPermit"]);
      expect(await balanceOf(USDC.address, payerB.address)).toBe(fromBefore - amount);
      expect(await balanceOf(USDC.address, merchant)).toBe(toBefore + amount);
      expect(await publicClient.readContract({ address: USDC.address, abi: stableAbi, functionName: "allowance", args: [payerB.address, PERMIT2_ADDRESS] })).toBe(0n);
    }
  });

  it("reverts InvalidAmount, InvalidOwner, InvalidDestination, PaymentTooEarly, Permit2612AmountMismatch, in the deployed proxy's order", async () => {
    const witness = { to: merchant, validAfter: 0n };
    const { permit, signature } = await signPermit2(payerA, USDT.address, 10n, witness);
    const zero: Address = "0x0000000000000000000000000000000000000000";
    // A zero amount is refused first, before the parties and the time window.
    const nothing = await signPermit2(payerA, USDT.address, 0n, witness);
    expect(await revertOf(simulate(EXACT_PERMIT2_PROXY_ADDRESS, proxyAbi, "settle", [nothing.permit, payerA.address, witness, nothing.signature]))).toBe("InvalidAmount");
    expect(await revertOf(simulate(EXACT_PERMIT2_PROXY_ADDRESS, proxyAbi, "settle", [nothing.permit, zero, { to: zero, validAfter: (await now()) + 3600n }, nothing.signature]))).toBe("InvalidAmount");
    expect(await revertOf(simulate(EXACT_PERMIT2_PROXY_ADDRESS, proxyAbi, "settle", [permit, zero, { to: zero, validAfter: (await now()) + 3600n }, signature]))).toBe("InvalidOwner");
    expect(await revertOf(simulate(EXACT_PERMIT2_PROXY_ADDRESS, proxyAbi, "settle", [permit, payerA.address, { to: zero, validAfter: (await now()) + 3600n }, signature]))).toBe("InvalidDestination");
    expect(await revertOf(simulate(EXACT_PERMIT2_PROXY_ADDRESS, proxyAbi, "settle", [permit, zero, witness, signature]))).toBe("InvalidOwner");
    expect(await revertOf(simulate(EXACT_PERMIT2_PROXY_ADDRESS, proxyAbi, "settle", [permit, payerA.address, { to: zero, validAfter: 0n }, signature]))).toBe("InvalidDestination");
    const later = { to: merchant, validAfter: (await now()) + 3600n };
    const early = await signPermit2(payerA, USDT.address, 10n, later);
    expect(await revertOf(simulate(EXACT_PERMIT2_PROXY_ADDRESS, proxyAbi, "settle", [early.permit, payerA.address, later, early.signature]))).toBe("PaymentTooEarly");
    const p2612 = { value: 11n, deadline: permit.deadline, r: numberToHex(1, { size: 32 }), s: numberToHex(1, { size: 32 }), v: 27 };
    expect(await revertOf(simulate(EXACT_PERMIT2_PROXY_ADDRESS, proxyAbi, "settleWithPermit", [p2612, permit, payerA.address, witness, signature]))).toBe(
      "Permit2612AmountMismatch",
    );
    expect(await revertOf(simulate(EXACT_PERMIT2_PROXY_ADDRESS, proxyAbi, "settleWithPermit", [{ ...p2612, value: 10n }, permit, zero, witness, signature]))).toBe("InvalidOwner");
    // an invalid 2612 permit is not a revert: the deployed proxy reports it in an event (a fact of its
    // source, not in the published ABI), and with an existing allowance the payment still settles
    const before = await balanceOf(USDT.address, merchant);
    const receipt = await send(relayerWallet, EXACT_PERMIT2_PROXY_ADDRESS, proxyAbi, "settleWithPermit", [{ ...p2612, value: 10n }, permit, payerA.address, witness, signature]);
    expect(await balanceOf(USDT.address, merchant)).toBe(before + 10n);
    const logged = receipt.logs
      .filter((l) => l.address.toLowerCase() === EXACT_PERMIT2_PROXY_ADDRESS.toLowerCase())
      .map((l) => decodeEventLog({ abi: [...proxyAbi, ...permitFailedFacts], data: l.data, topics: l.topics }));
    expect(logged.map((e) => e.eventName)).toEqual([expect.stringMatching(/^EIP2612PermitFailedWith(Reason|Panic|Data)$/), "SettledWithPermit"]);
    expect(logged[0]!.args).toMatchObject({ owner: payerA.address });
  });

  it("Permit2 rejects a signature made for another spender, another witness or another owner", async () => {
    const witness = { to: merchant, validAfter: 0n };
    const wrongSpender = await signPermit2(payerA, USDT.address, 10n, witness, relayer.address);
    expect(await revertOf(simulate(EXACT_PERMIT2_PROXY_ADDRESS, proxyAbi, "settle", [wrongSpender.permit, payerA.address, witness, wrongSpender.signature]))).toBe("InvalidSigner");
    const good = await signPermit2(payerA, USDT.address, 10n, witness);
    expect(await revertOf(simulate(EXACT_PERMIT2_PROXY_ADDRESS, proxyAbi, "settle", [good.permit, payerA.address, { to: relayer.address, validAfter: 0n }, good.signature]))).toBe(
      "InvalidSigner",
    );
    expect(await revertOf(simulate(EXACT_PERMIT2_PROXY_ADDRESS, proxyAbi, "settle", [good.permit, payerB.address, witness, good.signature]))).toBe("InvalidSigner");
    const expired = { ...good.permit, deadline: (await now()) - 1n };
    expect(await revertOf(simulate(EXACT_PERMIT2_PROXY_ADDRESS, proxyAbi, "settle", [expired, payerA.address, witness, good.signature]))).toBe("SignatureExpired");
  });
});

describe("reference @x402/evm client and facilitator against the devnet", () => {
  function facilitatorSigner(): FacilitatorEvmSigner {
    const w = relayerWallet;
    return toFacilitatorEvmSigner(
      {
        address: relayer.address,
        readContract: (args) => w.readContract(args as never),
        verifyTypedData: (args) => w.verifyTypedData(args as never),
        writeContract: (args) => w.writeContract(args as never),
        sendTransaction: (args) => w.sendTransaction(args as never),
        waitForTransactionReceipt: (args) => w.waitForTransactionReceipt(args),
        getCode: (args) => w.getCode(args),
      },
      { confirmationTimeoutMs: 10_000 },
    );
  }

  function requirements(asset: AssetInfo, amount: bigint, extra: Record<string, unknown>) {
    return { scheme: "exact", network: `eip155:${CHAIN_ID}` as const, asset: asset.address, amount: amount.toString(), payTo: merchant, maxTimeoutSeconds: 120, extra };
  }

  async function payAndSettle(payer: PrivateKeyAccount, asset: AssetInfo, amount: bigint, extra: Record<string, unknown>, extensions?: Record<string, unknown>) {
    const client = new ExactEvmClientScheme(toClientEvmSigner(payer, publicClient));
    const facilitator = new ExactEvmFacilitatorScheme(facilitatorSigner());
    const req = requirements(asset, amount, extra);
    const created = await client.createPaymentPayload(2, req, extensions ? ({ extensions } as never) : undefined);
    const paymentPayload = { ...created, accepted: req };
    const verified = await facilitator.verify(paymentPayload, req);
    expect(verified).toMatchObject({ isValid: true });
    const before = await balanceOf(asset.address, merchant);
    const settled = await facilitator.settle(paymentPayload, req);
    expect(settled).toMatchObject({ success: true, network: req.network });
    expect(await balanceOf(asset.address, merchant)).toBe(before + amount);
    return { created, settled };
  }

  it("EIP-3009 payload: verify + settle", async () => {
    await payAndSettle(payerA, USDC, 10_000n, { name: "USD Coin", version: "2" });
  });

  it("Permit2 payload on the 18-decimal token: verify + settle through the proxy", async () => {
    const { created } = await payAndSettle(payerA, USDT, 10n ** 16n, { assetTransferMethod: "permit2" });
    expect((created.payload as { permit2Authorization: { spender: string } }).permit2Authorization.spender).toBe(EXACT_PERMIT2_PROXY_ADDRESS);
  });

  it("Permit2 payload with EIP-2612 gas sponsoring for a payer without allowance: settleWithPermit", async () => {
    const { created } = await payAndSettle(payerB, USDC, 20_000n, { assetTransferMethod: "permit2", name: "USD Coin", version: "2" }, { eip2612GasSponsoring: {} });
    expect(created.extensions).toHaveProperty("eip2612GasSponsoring");
  });
});

function encodeFunctionDataFor(abi: Abi, functionName: string, args: readonly unknown[]): Hex {
  return encodeFunctionData({ abi, functionName, args });
}
