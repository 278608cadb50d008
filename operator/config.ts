// `x402-fleet operator`: flags and environment → options, checked before main.ts loads the
// Kubernetes client and connects to anything.
import { defineCommand, FlagError, flagOrEnv, port, serviceCommand, stringFlags, type FlagValues } from "../services/platform/flags.ts";

const FLAGS = stringFlags("namespace", "watch-namespace", "facilitator-image", "host", "admin-port");

export interface OperatorOptions {
  /** Unset: POD_NAMESPACE, else the service account's, else x402-system (main.ts). */
  namespace?: string;
  watchNamespace?: string;
  facilitatorImage: string;
  host: string;
  adminPort: number;
  /** The Lease's timings (leader election), from X402_LEASE_*_SECONDS. */
  lease: LeaseTimings;
}

export interface LeaseTimings {
  leaseDurationMs: number;
  renewDeadlineMs: number;
  retryPeriodMs: number;
}

/**
 * X402_LEASE_DURATION_SECONDS, X402_LEASE_RENEW_DEADLINE_SECONDS, X402_LEASE_RETRY_PERIOD_SECONDS:
 * kube-controller-manager's --leader-elect-* defaults (15, 10, 2). A slow API server (a loaded
 * control plane) makes a leader miss its renew deadline and restart: wider timings ride it out,
 * at the price of a longer failover. Checked as client-go checks them.
 */
export function leaseTimingsFrom(env: NodeJS.ProcessEnv): LeaseTimings {
  const seconds = (name: string, fallback: number): number => {
    const text = env[name];
    if (text === undefined || text === "") return fallback;
    const value = Number(text);
    if (!/^\d+(\.\d+)?$/.test(text.trim()) || !(value > 0) || value > 3600) throw new FlagError(`${name}: ${JSON.stringify(text)} is not a number of seconds in (0, 3600]`);
    return value;
  };
  const lease = seconds("X402_LEASE_DURATION_SECONDS", 15);
  const renew = seconds("X402_LEASE_RENEW_DEADLINE_SECONDS", 10);
  const retry = seconds("X402_LEASE_RETRY_PERIOD_SECONDS", 2);
  if (renew >= lease) throw new FlagError(`X402_LEASE_RENEW_DEADLINE_SECONDS (${renew}) must be less than X402_LEASE_DURATION_SECONDS (${lease})`);
  // client-go's rule: a renewal gets at least one jittered retry before its deadline.
  if (renew <= retry * 1.2) throw new FlagError(`X402_LEASE_RENEW_DEADLINE_SECONDS (${renew}) must be more than 1.2 × X402_LEASE_RETRY_PERIOD_SECONDS (${retry})`);
  return { leaseDurationMs: lease * 1000, renewDeadlineMs: renew * 1000, retryPeriodMs: retry * 1000 };
}

export function operatorOptionsFrom(flags: FlagValues<typeof FLAGS>, env: NodeJS.ProcessEnv): OperatorOptions {
  const adminPort = port(...flagOrEnv("--admin-port", flags["admin-port"], env, "ADMIN_PORT")) ?? 9422;
  const facilitatorImage = flags["facilitator-image"] ?? env.X402_FACILITATOR_IMAGE;
  if (!facilitatorImage) throw new Error("operator: --facilitator-image (or X402_FACILITATOR_IMAGE) is required");
  return {
    namespace: flags.namespace,
    watchNamespace: flags["watch-namespace"] ?? (env.X402_WATCH_NAMESPACE || undefined),
    facilitatorImage,
    host: flags.host ?? env.HOST ?? "0.0.0.0",
    adminPort,
    lease: leaseTimingsFrom(env),
  };
}

export const operatorCli = serviceCommand({
  name: "operator",
  summary: "reconcile FacilitatorNetwork resources into facilitator pod sets and the routing table",
  help: `  --facilitator-image IMAGE   (env X402_FACILITATOR_IMAGE; required)
  [--namespace x402-system]   (env POD_NAMESPACE, else the service account's)
  [--watch-namespace NS]   (env X402_WATCH_NAMESPACE; default: every namespace)
  --admin-port 9422 --host 0.0.0.0   (env ADMIN_PORT, HOST)
env: X402_ROUTING_CONFIGMAP, X402_CLUSTER_DOMAIN, X402_LEADER_ELECTION=false, X402_LEASE_NAME, POD_NAME,
  X402_LEASE_DURATION_SECONDS=15, X402_LEASE_RENEW_DEADLINE_SECONDS=10, X402_LEASE_RETRY_PERIOD_SECONDS=2,
  X402_OPERATOR_ALLOW_PRIVATE_RPC=true, KUBECONFIG (docs/operator.md)
`,
  flags: FLAGS,
  optionsFrom: operatorOptionsFrom,
  start: async (options, env) => (await import("./main.ts")).runOperatorCommand(options, env),
});

export const preUninstallCli = defineCommand({
  name: "pre-uninstall",
  summary: "before the operator is uninstalled (the chart's pre-delete hook): stop it, release its finalizers, delete its routing ConfigMap and Lease",
  help: `  (no flags: configured by environment, as the chart's pre-delete hook sets it; docs/operator.md "Uninstalling")
env: X402_OPERATOR_DEPLOYMENT (required), POD_NAMESPACE (the operator's namespace, else the service account's),
  X402_WATCH_NAMESPACE (default: every namespace), X402_ROUTING_CONFIGMAP, X402_LEASE_NAME, KUBECONFIG
`,
  flags: {},
  run: async (_flags, env) => {
    const deployment = env.X402_OPERATOR_DEPLOYMENT;
    if (!deployment) throw new FlagError("X402_OPERATOR_DEPLOYMENT (the operator's Deployment) is required");
    const { KubeConfig } = await import("@kubernetes/client-node");
    const { connect } = await import("./kube.ts");
    const { operatorNamespace } = await import("./main.ts");
    const { prepareUninstall } = await import("./uninstall.ts");
    const { createLogger } = await import("../services/platform/logger.ts");
    const kubeConfig = new KubeConfig();
    kubeConfig.loadFromDefault();
    await prepareUninstall({
      kube: connect(kubeConfig),
      namespace: operatorNamespace(undefined, env),
      watchNamespace: env.X402_WATCH_NAMESPACE || undefined,
      operatorDeployment: deployment,
      routingConfigMap: env.X402_ROUTING_CONFIGMAP || "x402-fleet-routing",
      leaseName: env.X402_LEASE_NAME || "x402-fleet-operator",
      logger: createLogger("pre-uninstall"),
    });
  },
});
