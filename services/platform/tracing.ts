// OpenTelemetry traces. Code creates spans through @opentelemetry/api (a no-op until a provider is
// registered); `startTracing` registers the Node SDK with an OTLP exporter when
// OTEL_EXPORTER_OTLP_ENDPOINT is set. W3C trace context crosses router → facilitator in headers.
import { context, propagation, trace, INVALID_SPAN_CONTEXT, ProxyTracerProvider, ROOT_CONTEXT, SpanKind, SpanStatusCode, type Attributes, type Span, type SpanContext } from "@opentelemetry/api";

export const tracer = trace.getTracer("x402-fleet");

let sdk: { shutdown(): Promise<void> } | undefined;

/** Starts exporting traces if the standard OTEL_* environment asks for it. Idempotent. */
export async function startTracing(serviceName: string): Promise<void> {
  if (sdk || !process.env.OTEL_EXPORTER_OTLP_ENDPOINT) return;
  const { NodeSDK } = await import("@opentelemetry/sdk-node");
  const { OTLPTraceExporter } = await import("@opentelemetry/exporter-trace-otlp-http");
  const started = new NodeSDK({ serviceName: process.env.OTEL_SERVICE_NAME ?? serviceName, traceExporter: new OTLPTraceExporter(), instrumentations: [] });
  started.start();
  sdk = started;
}

export async function stopTracing(): Promise<void> {
  await sdk?.shutdown();
  sdk = undefined;
}

// Without a registered provider every span is a no-op: requests then skip the span machinery (an
// extra async frame and context switch per span, on every request and RPC call). The global
// provider is a proxy whose delegate is the shared no-op provider until one is registered.
const NOOP_SPAN = trace.wrapSpanContext(INVALID_SPAN_CONTEXT);
const NOOP_PROVIDER = new ProxyTracerProvider().getDelegate();
const tracingOff = () => (trace.getTracerProvider() as ProxyTracerProvider).getDelegate?.() === NOOP_PROVIDER;

/** Runs fn in a server span that continues the caller's trace (from `traceparent`). */
export function withServerSpan<T>(name: string, headers: Record<string, unknown>, attributes: Attributes, fn: (span: Span) => Promise<T>): Promise<T> {
  // A caller's trace context is still carried through (to the facilitator) when nothing records.
  if (tracingOff() && !headers.traceparent) return fn(NOOP_SPAN);
  const parent = propagation.extract(context.active(), headers);
  return tracer.startActiveSpan(name, { kind: SpanKind.SERVER, attributes }, parent, (span) => finish(span, fn));
}

/**
 * Runs fn in a span: a child of the active one, or with `links`, a root of its own linked to those
 * (work done for several requests at once, such as a JSON-RPC batch, belongs to no one trace).
 */
export function withSpan<T>(name: string, attributes: Attributes, fn: (span: Span) => Promise<T>, kind: SpanKind = SpanKind.INTERNAL, links?: readonly SpanContext[]): Promise<T> {
  if (tracingOff()) return fn(NOOP_SPAN);
  if (links) return tracer.startActiveSpan(name, { kind, attributes, links: links.map((context) => ({ context })), root: true }, ROOT_CONTEXT, (span) => finish(span, fn));
  return tracer.startActiveSpan(name, { kind, attributes }, (span) => finish(span, fn));
}

/** The active span's context where tracing records (a link to it), else undefined. */
export function activeSpanContext(): SpanContext | undefined {
  if (tracingOff()) return undefined;
  const span = trace.getSpan(context.active());
  return span?.isRecording() ? span.spanContext() : undefined;
}

async function finish<T>(span: Span, fn: (span: Span) => Promise<T>): Promise<T> {
  try {
    return await fn(span);
  } catch (e) {
    // The error type only: messages can quote URLs or payloads.
    span.setStatus({ code: SpanStatusCode.ERROR, message: (e as Error)?.name ?? "Error" });
    throw e;
  } finally {
    span.end();
  }
}

/** Headers that carry the active trace to the next service. */
export function traceHeaders(): Record<string, string> {
  const carrier: Record<string, string> = {};
  propagation.inject(context.active(), carrier);
  return carrier;
}
