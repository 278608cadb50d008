// The /fetch guard refuses every non-public destination, including the IPv6 forms that embed or
// translate to an IPv4 address (mapped, compatible, NAT64, 6to4) and deprecated site-local: each
// range by table (its first address, one inside, one written the way WHATWG URLs normalise it), and
// through the running service, where a literal in the URL never reaches a socket.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BLOCKED_RANGES, isPrivateAddress } from "../services/platform/egress.ts";
import { createPlatform, createWallet, call, errorCode, startTestWallets, type TestWallets } from "./helpers/wallets.ts";

const SAMPLES: Record<string, string[]> = {
  "::/96": ["::", "::1", "::7f00:1", "::127.0.0.1", "::8.8.8.8"],
  "::ffff:0:0/96": ["::ffff:127.0.0.1", "::ffff:7f00:1", "::ffff:10.0.0.1", "::ffff:a9fe:a9fe", "::ffff:8.8.8.8"],
  "64:ff9b::/96": ["64:ff9b::", "64:ff9b::127.0.0.1", "64:ff9b::a9fe:a9fe", "64:ff9b::8.8.8.8"],
  "64:ff9b:1::/48": ["64:ff9b:1::", "64:ff9b:1::a00:1", "64:ff9b:1:ffff::1"],
  "2002::/16": ["2002::", "2002:7f00:1::1", "2002:a9fe:a9fe::", "2002:ffff:ffff:ffff::1"],
  "fec0::/10": ["fec0::", "fec0::1", "feff:ffff::1"],
  "fc00::/7": ["fc00::1", "fd12:3456::1"],
  "fe80::/10": ["fe80::1", "fe80::1%eth0", "febf::1"],
  "ff00::/8": ["ff02::1"],
  "100::/64": ["100::1"],
  "2001:db8::/32": ["2001:db8::1"],
  "10.0.0.0/8": ["10.0.0.0", "10.255.255.255"],
  "127.0.0.0/8": ["127.0.0.1", "127.255.255.254"],
  "169.254.0.0/16": ["169.254.169.254"],
  "172.16.0.0/12": ["172.16.0.1", "172.31.255.255"],
  "192.168.0.0/16": ["192.168.1.1"],
  "100.64.0.0/10": ["100.64.0.1", "100.127.255.255"],
  "0.0.0.0/8": ["0.0.0.0", "0.1.2.3"],
  "192.0.0.0/24": ["192.0.0.170"],
  "192.0.2.0/24": ["192.0.2.1"],
  "192.88.99.0/24": ["192.88.99.1"],
  "198.18.0.0/15": ["198.18.0.1", "198.19.255.255"],
  "198.51.100.0/24": ["198.51.100.7"],
  "203.0.113.0/24": ["203.0.113.9"],
  "224.0.0.0/4": ["224.0.0.1", "239.255.255.250"],
  "240.0.0.0/4": ["240.0.0.1", "255.255.255.255"],
};

/** Public neighbours just outside the ranges: still allowed. */
const PUBLIC = ["8.8.8.8", "1.1.1.1", "100.128.0.1", "172.32.0.1", "2606:4700::1111", "2003::1", "2001:4860:4860::8888", "64:ff9b:2::1", "2001:db9::1"];

describe("the /fetch destination table", () => {
  it("has samples for every range it refuses, and refuses each sample", () => {
    expect(Object.keys(SAMPLES).sort()).toEqual(BLOCKED_RANGES.map(([n, p]) => `${n}/${p}`).sort());
    for (const [range, addresses] of Object.entries(SAMPLES)) {
      for (const a of addresses) expect(isPrivateAddress(a), `${a} (${range})`).toBe(true);
    }
  });

  it("allows public addresses next to the ranges", () => {
    for (const a of PUBLIC) expect(isPrivateAddress(a), a).toBe(false);
  });

  it("treats anything that is not an IP address as not public", () => {
    for (const a of ["", "localhost", "[::1]", "1.2.3", "::ffff:999.0.0.1"]) expect(isPrivateAddress(a), a).toBe(true);
  });
});

describe("POST /fetch to IPv6 literals that embed or translate to IPv4", () => {
  let w: TestWallets | undefined;
  let apiKey = "";
  let walletId = "";

  beforeAll(async () => {
    w = await startTestWallets("embedded");
    ({ apiKey } = await createPlatform(w));
    walletId = (await createWallet(w, apiKey)).id;
  }, 60_000);
  afterAll(async () => w?.stop());

  it.each([
    ["IPv4-mapped", "http://[::ffff:127.0.0.1]:9/x"],
    ["IPv4-mapped, hex", "http://[::ffff:a9fe:a9fe]/latest/meta-data"],
    ["IPv4-compatible", "http://[::127.0.0.1]:9/x"],
    ["NAT64", "http://[64:ff9b::169.254.169.254]/latest/meta-data"],
    ["NAT64 local-use", "http://[64:ff9b:1::a00:1]:9/x"],
    ["6to4", "http://[2002:7f00:1::]:9/x"],
    ["site-local", "http://[fec0::1]:9/x"],
  ])("refuses %s (%s) with 403 destination_not_allowed", async (_name, url) => {
    const r = await call(w!.url, apiKey, "POST", `/v1/wallets/${walletId}/fetch`, { url });
    expect(r.status, JSON.stringify(r.json)).toBe(403);
    expect(errorCode(r)).toBe("destination_not_allowed");
  });
});
