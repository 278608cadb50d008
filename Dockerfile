# One image for every x402-fleet subcommand: the entrypoint is the `x402-fleet` command, the
# subcommand is the first argument (router, facilitator, operator, hub, devnet, ...), as in the
# Helm chart and in the Deployments the operator creates (args: ["facilitator"]).
#
#   docker build -t x402-fleet:0.1.0 .
#   docker run --rm --read-only --tmpfs /tmp -p 4020:4020 -p 9420:9420 \
#     -v "$PWD/routing.json:/etc/x402-fleet/routing/routing.json:ro" \
#     -e HOST=0.0.0.0 x402-fleet:0.1.0 router --routing-table /etc/x402-fleet/routing/routing.json
#
# No `# syntax=` line: BuildKit would pull its frontend from a registry, and nothing here needs more
# than the built-in one (an air-gapped build works).
#
# The services run bundled (dist/, built by scripts/build.mjs in the deps stage): no TypeScript
# loader in the pods, about 40 MB less resident memory per process. The sources come along, as
# bin/x402-fleet.js runs the bundle only while it matches them. The root filesystem can be
# read-only: the only writes are under $TMPDIR (/tmp: an emptyDir in the chart, --tmpfs /tmp with
# docker) and the data directories given by flags or environment (X402_DATA_DIR, X402_ROUTER_DATA_DIR,
# HUB_DATA_DIR, WALLETS_DATA_DIR), which the chart and the operator mount; the image's defaults for them are
# under /tmp (the sources' defaults, .data/... beside the working directory, are the read-only /app).
#
# The devnet is not in the image: anvil, solc and @uniswap/v4-periphery (about 134 MB, only the
# devnet loads them) are removed after the build; `x402-fleet devnet` says it needs a checkout.

ARG NODE_VERSION=20

# ---- dependencies: production only, native addons compiled against glibc ----------------------
FROM node:${NODE_VERSION}-bookworm AS deps
WORKDIR /app
# .npmrc: legacy-peer-deps, so that the lockfile's dev-only helm package (whose AWS CDK peers are
# not installed) does not make `npm ci` refuse the lockfile.
COPY package.json package-lock.json .npmrc ./
# npm can end a failed install with status 0 ("Exit handler never called!"): the stage fails here,
# where the install failed, when npm's record of the tree or any direct dependency is missing.
RUN npm ci --omit=dev --no-audit --no-fund \
 && node -e 'const fs = require("fs"); const deps = Object.keys(require("./package.json").dependencies); const missing = ["node_modules/.package-lock.json", ...deps.map((d) => "node_modules/" + d + "/package.json")].filter((f) => !fs.existsSync(f)); if (missing.length) { console.error("npm ci did not install: " + missing.join(", ")); process.exit(1); }' \
 && npm cache clean --force
COPY bin ./bin
COPY services ./services
COPY operator ./operator
COPY scripts/build.mjs ./scripts/build.mjs
# Devnet-only packages go once the bundle is built (the production commands never load them).
RUN node scripts/build.mjs \
 && rm -rf node_modules/@foundry-rs node_modules/solc node_modules/@uniswap/v4-periphery

# ---- runtime -------------------------------------------------------------------------------------
FROM node:${NODE_VERSION}-bookworm-slim AS runtime
# A 4 MB young generation (Node's default is 16): the services' request garbage is short-lived, and
# after load a facilitator keeps about 40 MB less resident memory with no CPU cost measured in the
# bench (which runs our services with these options, read from here).
# The embedded stores' default directories are writable in the image (under /tmp, gone with the
# container): the pods get theirs from the operator (a claim) or use PostgreSQL (DATABASE_URL).
ENV NODE_ENV=production \
    NODE_OPTIONS="--max-semi-space-size=4" \
    HOME=/tmp \
    TMPDIR=/tmp \
    X402_DATA_DIR=/tmp/x402-fleet/facilitator \
    X402_ROUTER_DATA_DIR=/tmp/x402-fleet/router \
    HUB_DATA_DIR=/tmp/x402-fleet/hub \
    WALLETS_DATA_DIR=/tmp/x402-fleet/wallets
WORKDIR /app
COPY --from=deps /app/node_modules ./node_modules
COPY --from=deps /app/dist ./dist
COPY package.json ./
COPY bin ./bin
COPY services ./services
COPY operator ./operator
# Everything belongs to root and is read-only for the process; it runs as an unprivileged uid
# (the chart and the operator's facilitator pods use the same 65532).
USER 65532:65532
# router 4020, facilitator 4021, hub 4030; admin ports (metrics, probes) 9420, 9421, 9422, 9430
EXPOSE 4020 4021 4030 9420 9421 9422 9430
ENTRYPOINT ["node", "/app/bin/x402-fleet.js"]
CMD ["help"]
