// kube-network-policies (sigs.k8s.io/kube-network-policies) for the test node, run as a host
// process beside kube-proxy: upstream's NetworkPolicy controller, which judges the first packet of
// each connection read from an nfqueue against the NetworkPolicies (pods and namespaces from the API
// server) and accepts or drops it, started with a kubeconfig. Upstream's own main (cmd/) connects
// in-cluster only, ignores its --disable-nri flag and stops on SIGINT only; this one takes
// --kubeconfig, never reaches a runtime's NRI socket (pod IPs come from the API server), stops on
// SIGTERM too, and exits non-zero when the controller stops (an nfqueue it cannot bind would leave
// traffic dropped). NRI: Config.NRIdisabled would be the way, but v0.8.0 then calls its nil NRI
// plugin for every address that is no pod's (a panic at the first packet from this host or the
// internet); so the plugin is kept and given no socket (NRI_PLUGIN_SOCKET=none: its start fails,
// logged, before any dial).
// It also serves /known: the NetworkPolicies and pod addresses in the controller's own informer
// caches (the same shared informers), so a test knows when a policy it wrote is being enforced.
//
// The controller also writes its own nftables table to send packets to the queue; a kernel built
// without nft's queue expression (CONFIG_NFT_QUEUE) refuses that table, and the controller logs the
// failure and judges whatever reaches its queue: test/helpers/network-policy.ts then sends the
// packets with an xtables NFQUEUE rule.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server (required)")
	nodeName := flag.String("hostname-override", "", "the Node whose pods are policed (required)")
	metrics := flag.String("metrics-bind-address", "127.0.0.1:9080", "/metrics and /healthz")
	queueID := flag.Int("nfqueue-id", 100, "the nfqueue the first packets are sent to")
	table := flag.String("nftables-table", "kube-network-policies", "its inet nftables table (deleted at stop)")
	dnsFix := flag.Bool("netfilter-bug-1766-fix", true, "DNS packets judged on prerouting (kernels before 6.12)")
	klog.InitFlags(nil)
	flag.Parse()
	if *kubeconfig == "" || *nodeName == "" {
		fmt.Fprintln(os.Stderr, "network-policies: --kubeconfig and --hostname-override are required")
		os.Exit(2)
	}
	if os.Getenv("NRI_PLUGIN_SOCKET") == "" {
		_ = os.Setenv("NRI_PLUGIN_SOCKET", "none")
	}
	os.Exit(run(*kubeconfig, *metrics, networkpolicy.Config{
		QueueID:             *queueID,
		NodeName:            *nodeName,
		NFTableName:         *table,
		NetfilterBug1766Fix: *dnsFix,
	}))
}

func run(kubeconfig, metrics string, cfg networkpolicy.Config) int {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		klog.ErrorS(err, "reading the kubeconfig")
		return 1
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		klog.ErrorS(err, "creating the client")
		return 1
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	controller, err := networkpolicy.NewController(client,
		factory.Networking().V1().NetworkPolicies(), factory.Core().V1().Namespaces(), factory.Core().V1().Pods(),
		nil, nil, nil, nil, cfg)
	if err != nil {
		klog.ErrorS(err, "creating the controller")
		return 1
	}

	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.Handler())
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	policies, pods := factory.Networking().V1().NetworkPolicies().Lister(), factory.Core().V1().Pods().Lister()
	mux.HandleFunc("/known", func(w http.ResponseWriter, _ *http.Request) {
		known := struct {
			Policies []string          `json:"policies"`
			Pods     map[string]string `json:"pods"`
		}{Policies: []string{}, Pods: map[string]string{}}
		all, _ := policies.List(labels.Everything())
		for _, p := range all {
			known.Policies = append(known.Policies, p.Namespace+"/"+p.Name)
		}
		running, _ := pods.List(labels.Everything())
		for _, p := range running {
			for _, ip := range p.Status.PodIPs {
				known.Pods[ip.IP] = p.Namespace + "/" + p.Name
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(known)
	})
	server := &http.Server{Addr: metrics, Handler: mux}
	go func() {
		if err := server.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.ErrorS(err, "serving metrics")
			cancel()
		}
	}()
	defer server.Close()

	done := make(chan error, 1)
	go func() { done <- controller.Run(ctx) }() // deletes its table when ctx ends
	factory.Start(ctx.Done())
	err = <-done
	if ctx.Err() == nil {
		klog.ErrorS(err, "the controller stopped")
		return 1
	}
	klog.InfoS("stopped")
	return 0
}
