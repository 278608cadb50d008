// `x402-fleet operator`: the Kubernetes connection (in-cluster service account, or KUBECONFIG /
// ~/.kube/config), the admin port, and the process lifecycle: SIGTERM stops gracefully (the CLI's
// handler); a lost Lease exits non-zero so the pod restarts as a candidate. config.ts checks the flags.
import { existsSync, readFileSync } from "node:fs";
import { KubeConfig } from "@kubernetes/client-node";
import { startAdminServer } from "../services/platform/admin.ts";
import { createLogger } from "../services/platform/logger.ts";
import { createMetrics } from "../services/platform/metrics.ts";
import type { OperatorOptions } from "./config.ts";
import { startOperator } from "./operator.ts";

const SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

export function operatorNamespace(flag: string | undefined, env: NodeJS.ProcessEnv): string {
  if (flag) return flag;
  if (env.POD_NAMESPACE) return env.POD_NAMESPACE;
  if (existsSync(SERVICE_ACCOUNT_NAMESPACE)) return readFileSync(SERVICE_ACCOUNT_NAMESPACE, "utf8").trim();
  return "x402-system";
}

export async function runOperatorCommand(options: OperatorOptions, env: NodeJS.ProcessEnv = process.env): Promise<{ close(): Promise<void> }> {
  const logger = createLogger("operator");
  const { facilitatorImage } = options;
  const kubeConfig = new KubeConfig();
  kubeConfig.loadFromDefault();
  const metrics = createMetrics("operator");
  const namespace = operatorNamespace(options.namespace, env);
  const leaderElection = env.X402_LEADER_ELECTION === "false" ? false : { leaseName: env.X402_LEASE_NAME || undefined, ...options.lease };
  const operator = await startOperator({
    kubeConfig,
    namespace,
    watchNamespace: options.watchNamespace,
    facilitatorImage,
    routingConfigMap: env.X402_ROUTING_CONFIGMAP || undefined,
    clusterDomain: env.X402_CLUSTER_DOMAIN || undefined,
    leaderElection,
    allowPrivateRpc: env.X402_OPERATOR_ALLOW_PRIVATE_RPC === "true",
    routerPodLabels: env.X402_ROUTER_POD_LABELS ? labelsOf(env.X402_ROUTER_POD_LABELS) : undefined,
    routerTokenSecret: env.X402_ROUTER_TOKEN_SECRET ? { name: env.X402_ROUTER_TOKEN_SECRET, key: env.X402_ROUTER_TOKEN_SECRET_KEY || "tokens" } : undefined,
    metrics,
    logger,
  });
  const admin = await startAdminServer({
    host: options.host,
    port: options.adminPort,
    registry: metrics.registry,
    // a follower is ready (it waits for the Lease); a leader once its caches are synced
    checks: [{ name: "caches_synced", check: async () => !operator.isLeader() || operator.synced() }],
    logger,
  });
  logger.info({ namespace, admin: admin.url, identity: operator.identity, leaderElection: leaderElection !== false }, "operator started");
  void operator.ended.then((why) => {
    if (why === "leadership-lost") {
      logger.error("exiting after losing the Lease; the pod restarts as a candidate");
      process.exit(1);
    }
  });
  return {
    close: async () => {
      await operator.stop();
      await admin.close();
    },
  };
}

/** `k=v,k=v` (X402_ROUTER_POD_LABELS) as labels. */
function labelsOf(text: string): Record<string, string> {
  const labels: Record<string, string> = {};
  for (const pair of text.split(",").map((p) => p.trim()).filter(Boolean)) {
    const at = pair.indexOf("=");
    if (at <= 0) throw new Error(`operator: X402_ROUTER_POD_LABELS: ${pair} is not key=value`);
    labels[pair.slice(0, at)] = pair.slice(at + 1);
  }
  return labels;
}
