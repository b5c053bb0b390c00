package images

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/flatnet/flatnet/internal/lab/controlplane"
)

// NewCommand is `flatnet lab images`: build (or find in the cache) every
// image a lab with real nodes imports and print where they are.
func NewCommand() *cobra.Command {
	var cfg Config
	cmd := &cobra.Command{
		Use:   "images",
		Short: "Build the images of a lab with real nodes (pause, agnhost, glibc-dns-testing, busybox, nginx, coredns, echo-basic, flatnet:dev) as tarballs for `ctr images import`",
		Long: "Builds the images without a registry or a container engine: a Debian root made once with\n" +
			"debootstrap (needs root and the Debian mirror the first time), agnhost from\n" +
			"`hack/build-k8s.sh agnhost`, CoreDNS from `hack/build-coredns.sh`, echo-basic (the Gateway API conformance suite's\n" +
			"backend; its images are left out without it) from `hack/build-echo-basic.sh`, flatnet's binaries from `make build`. Each image is one\n" +
			"docker-archive tarball under its upstream name, rebuilt only when its inputs change. See docs/lab.md.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := defaults(&cfg); err != nil {
				return err
			}
			cfg.Log = cmd.ErrOrStderr()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			start := time.Now()
			ts, err := E2E(ctx, cfg)
			if err != nil {
				return err
			}
			PrintTable(cmd.OutOrStdout(), ts)
			fmt.Fprintf(cmd.OutOrStdout(), "%d images in %s, total %s\n", len(ts), cfg.CacheDir, time.Since(start).Round(10*time.Millisecond))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.CacheDir, "cache-dir", "", "where the Debian root and the tarballs are kept (default ${FLATNET_CACHE:-$HOME/.cache/flatnet}/images)")
	f.StringVar(&cfg.FlatnetBin, "bin-dir", "", "directory with flatnet, flatnet-cni and flatnet-pause (default: this flatnet's directory)")
	f.StringVar(&cfg.Agnhost, "agnhost", "", "the agnhost binary (default: where hack/build-k8s.sh agnhost puts it)")
	f.StringVar(&cfg.CoreDNS, "coredns", "", "the coredns binary for agnhost's /coredns and the coredns image (default: where hack/build-coredns.sh puts it)")
	f.StringVar(&cfg.EchoBasic, "echo-basic", "", "the echo-basic binary (default: where hack/build-echo-basic.sh puts it, when it is there)")
	f.StringVar(&cfg.Mirror, "mirror", DefaultMirror, "Debian archive for debootstrap")
	return cmd
}

func defaults(cfg *Config) error {
	var err error
	if cfg.CacheDir == "" {
		if cfg.CacheDir, err = DefaultCacheDir(); err != nil {
			return err
		}
	}
	if cfg.FlatnetBin == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("finding this flatnet binary: %w", err)
		}
		cfg.FlatnetBin = filepath.Dir(exe)
	}
	if cfg.Agnhost == "" || cfg.CoreDNS == "" || cfg.EchoBasic == "" {
		dir, err := controlplane.CacheBinDir()
		if err != nil {
			return err
		}
		if cfg.Agnhost == "" {
			cfg.Agnhost = filepath.Join(dir, "agnhost")
		}
		if cfg.CoreDNS == "" {
			cfg.CoreDNS = filepath.Join(dir, "coredns")
		}
		// Optional: without it, no echo-basic images.
		if p := filepath.Join(dir, "echo-basic"); cfg.EchoBasic == "" && fileExists(p) {
			cfg.EchoBasic = p
		}
	}
	return nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// PrintTable writes one line per tarball: name, size, time, cached.
func PrintTable(w io.Writer, ts []Tarball) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "IMAGE\tSIZE\tTIME\tCACHED\tTARBALL")
	for _, t := range ts {
		fmt.Fprintf(tw, "%s\t%.1f MB\t%s\t%v\t%s\n", t.Ref, float64(t.Size)/1e6, t.Took.Round(10*time.Millisecond), t.Cached, filepath.Base(t.Path))
	}
	tw.Flush()
}
