// Outbound requests to URLs that callers or users supply (the wallet service's /fetch, the
// operator's RPC checks): unless private networks are allowed, they cannot reach loopback, private,
// link-local, cloud-metadata or cluster-internal addresses. The check runs on the resolved
// addresses inside the connection (undici's connect lookup), so a DNS name cannot point past it,
// and on literal hosts before any connection.
import { lookup as dnsLookup, type LookupAddress, type LookupOptions } from "node:dns";
import { BlockList, isIP } from "node:net";
import { Agent, buildConnector, fetch as undiciFetch, type Dispatcher } from "undici";

/**
 * Destinations refused (unless private networks are allowed), with why. IPv6 forms that
 * embed or translate to an IPv4 address (mapped, compatible, NAT64, 6to4) are refused whole: the
 * embedded address could be any of the IPv4 ranges above, and a public one has a plain IPv4 form.
 */
export const BLOCKED_RANGES: readonly (readonly [network: string, prefix: number, why: string])[] = [
  ["0.0.0.0", 8, "this network"],
  ["10.0.0.0", 8, "private"],
  ["100.64.0.0", 10, "carrier-grade NAT"],
  ["127.0.0.0", 8, "loopback"],
  ["169.254.0.0", 16, "link-local (cloud metadata)"],
  ["172.16.0.0", 12, "private"],
  ["192.0.0.0", 24, "IETF protocol assignments"],
  ["192.0.2.0", 24, "documentation"],
  ["192.88.99.0", 24, "6to4 relay anycast"],
  ["192.168.0.0", 16, "private"],
  ["198.18.0.0", 15, "benchmarking"],
  ["198.51.100.0", 24, "documentation"],
  ["203.0.113.0", 24, "documentation"],
  ["224.0.0.0", 4, "multicast"],
  ["240.0.0.0", 4, "reserved, broadcast"],
  ["::", 96, "unspecified, loopback, IPv4-compatible ::a.b.c.d"],
  ["::ffff:0:0", 96, "IPv4-mapped ::ffff:a.b.c.d"],
  ["64:ff9b::", 96, "NAT64 well-known prefix"],
  ["64:ff9b:1::", 48, "NAT64 local-use prefix"],
  ["100::", 64, "discard"],
  ["2001:db8::", 32, "documentation"],
  ["2002::", 16, "6to4"],
  ["fc00::", 7, "unique local"],
  ["fe80::", 10, "link-local"],
  ["fec0::", 10, "site-local (deprecated)"],
  ["ff00::", 8, "multicast"],
];

// One list per family: node's BlockList matches IPv4 addresses against IPv6 rules through their
// embedded forms (::/96 would then refuse every IPv4 address).
const blocked4 = new BlockList();
const blocked6 = new BlockList();
for (const [network, prefix] of BLOCKED_RANGES) {
  if (isIP(network) === 4) blocked4.addSubnet(network, prefix, "ipv4");
  else blocked6.addSubnet(network, prefix, "ipv6");
}

export function isPrivateAddress(address: string): boolean {
  const family = isIP(address);
  if (family === 4) return blocked4.check(address, "ipv4");
  if (family === 6) return blocked6.check(address.replace(/%.*$/, ""), "ipv6"); // a zone id does not change the address
  return true;
}

type LookupCallback = (err: NodeJS.ErrnoException | null, address: string | LookupAddress[], family?: number) => void;

/** dns.lookup that refuses names resolving to any non-public address (used inside undici's connect). */
export function guardedLookup(hostname: string, options: LookupOptions, callback: LookupCallback): void {
  dnsLookup(hostname, { ...options, all: true }, (err, addresses) => {
    if (err) return callback(err, "");
    const list = addresses as LookupAddress[];
    const bad = list.find((a) => isPrivateAddress(a.address));
    if (bad) {
      const e = new Error(`destination ${hostname} resolves to a non-public address`) as NodeJS.ErrnoException;
      e.code = DESTINATION_NOT_ALLOWED;
      return callback(e, "");
    }
    if (options.all) return callback(null, list);
    callback(null, list[0]!.address, list[0]!.family);
  });
}

/** Names that are never public: localhost, and the cluster's own DNS (Services, pods). */
const INTERNAL_NAME = /(^|\.)(localhost|svc|cluster\.local|internal)$/i;

/** Why a URL's host is refused before any connection (a literal non-public address or an internal name), or undefined. */
export function literalDestinationProblem(url: URL): string | undefined {
  const host = url.hostname.replace(/^\[|\]$/g, "").replace(/\.$/, "");
  if (INTERNAL_NAME.test(host)) return `${url.hostname} is a local or cluster-internal name`;
  if (isIP(host) && isPrivateAddress(host)) return `${url.hostname} is not a public address`;
  return undefined;
}

/** The error code of a connection refused by the guard (on the error's cause, as undici reports it). */
export const DESTINATION_NOT_ALLOWED = "X402_DESTINATION_NOT_ALLOWED";

/** A refused destination, thrown by a guarded fetch. */
export class DestinationNotAllowed extends Error {
  readonly code = DESTINATION_NOT_ALLOWED;
}

export interface Egress {
  /** fetch (undici) through the guard: a refused destination throws DestinationNotAllowed. Takes a URL, not a Request. */
  fetch: typeof fetch;
  dispatcher: Dispatcher;
  /** Ends every connection, in flight or idle (shutdown). */
  close(): Promise<void>;
}

/**
 * undici's connector with the guard at the socket: names are checked on the addresses they resolve
 * to (guardedLookup), and literal IP hosts, which never reach a lookup, are checked here. Every
 * connection of the dispatcher passes it, redirect targets included.
 */
function guardedConnector(): buildConnector.connector {
  const base = buildConnector({ lookup: guardedLookup as never });
  return (options, callback) => {
    const host = options.hostname.replace(/^\[|\]$/g, "");
    if (isIP(host) && isPrivateAddress(host)) {
      const e = new Error(`destination ${options.hostname} is not a public address`) as NodeJS.ErrnoException;
      e.code = DESTINATION_NOT_ALLOWED;
      return callback(e, null);
    }
    return base(options, callback);
  };
}

export function createEgress(opts: { allowPrivateNetworks: boolean; headersTimeoutMs?: number; bodyTimeoutMs?: number }): Egress {
  const dispatcher: Dispatcher = new Agent({
    connect: opts.allowPrivateNetworks ? {} : guardedConnector(),
    headersTimeout: opts.headersTimeoutMs,
    bodyTimeout: opts.bodyTimeoutMs,
  });
  return {
    dispatcher,
    async fetch(url, init) {
      if (typeof url !== "string" && !(url instanceof URL)) throw new TypeError("egress fetch takes a URL and init, not a Request");
      const target = new URL(url);
      const literal = opts.allowPrivateNetworks ? undefined : literalDestinationProblem(target);
      if (literal) throw new DestinationNotAllowed(literal);
      try {
        // No redirects: an RPC endpoint has no business sending the caller elsewhere.
        return (await undiciFetch(target, { ...(init as object), redirect: "manual", dispatcher })) as unknown as Response;
      } catch (e) {
        if ((e as { cause?: { code?: string } }).cause?.code === DESTINATION_NOT_ALLOWED) throw new DestinationNotAllowed(`${target.hostname} resolves to a non-public address`);
        throw e;
      }
    },
    close: () => dispatcher.destroy(),
  };
}
