// Preloaded into a service process by test/process-guard.test.ts: on SIGUSR2 it leaks one promise
// rejection and throws one exception outside any handler, both quoting a secret-bearing RPC URL,
// as a provider fault escaping a request path would.
process.on("SIGUSR2", () => {
  void Promise.reject(new Error("HTTP request failed: https://rpc.example.com/v3/SECRET-API-KEY status 429"));
  setTimeout(() => {
    throw new TypeError("fetch failed https://user:SECRET-PASSWORD@rpc.example.com/");
  }, 0);
});
