// Package promhist reads a lab agent's Prometheus histograms for the
// benchmarks: scrape /metrics inside a node's network namespace, take the
// difference of two readings (the observations made in between) and read
// quantiles from the buckets as Prometheus's histogram_quantile does, so
// a figure here is the one a dashboard over the same metric shows.
package promhist

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"sort"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/flatnet/flatnet/internal/netns"
)

// Scrape fetches and parses the Prometheus text at addr/metrics from
// inside the network namespace at nsPath (a lab node's agent listens on
// its loopback).
func Scrape(nsPath, addr string) (map[string]*dto.MetricFamily, error) {
	var conn net.Conn
	err := netns.Do(nsPath, func() error {
		var err error
		conn, err = net.DialTimeout("tcp", addr, 3*time.Second)
		return err
	})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	req, err := http.NewRequest("GET", "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Close = true
	if err := req.Write(conn); err != nil {
		return nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("%s/metrics: %s: %s", addr, resp.Status, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// Hist is a Prometheus histogram summed over its series: cumulative
// counts per upper bound.
type Hist struct {
	Bounds []float64
	Counts []float64 // cumulative, per bound; the last bound is +Inf
	Sum    float64
	Count  float64
}

// Histogram is the histogram name in mf summed over its series, or over
// those whose labels have the values given as name, value pairs.
func Histogram(mf map[string]*dto.MetricFamily, name string, labels ...string) Hist {
	var h Hist
	f := mf[name]
	if f == nil {
		return h
	}
	byBound := map[float64]float64{}
	for _, m := range f.GetMetric() {
		if !hasLabels(m, labels) {
			continue
		}
		hm := m.GetHistogram()
		if hm == nil {
			continue
		}
		h.Sum += hm.GetSampleSum()
		h.Count += float64(hm.GetSampleCount())
		for _, b := range hm.GetBucket() {
			byBound[b.GetUpperBound()] += float64(b.GetCumulativeCount())
		}
	}
	for b := range byBound {
		h.Bounds = append(h.Bounds, b)
	}
	sort.Float64s(h.Bounds)
	for _, b := range h.Bounds {
		h.Counts = append(h.Counts, byBound[b])
	}
	h.Bounds = append(h.Bounds, math.Inf(1))
	h.Counts = append(h.Counts, h.Count)
	return h
}

// Minus is h - before: the observations made between the two readings.
func (h Hist) Minus(before Hist) Hist {
	d := Hist{Bounds: h.Bounds, Sum: h.Sum - before.Sum, Count: h.Count - before.Count}
	for i, c := range h.Counts {
		if i < len(before.Counts) {
			c -= before.Counts[i]
		}
		d.Counts = append(d.Counts, c)
	}
	return d
}

// Quantile interpolates linearly inside the bucket holding q, as
// Prometheus's histogram_quantile does (the +Inf bucket answers with the
// highest finite bound). NaN with no observations.
func (h Hist) Quantile(q float64) float64 {
	if h.Count == 0 || len(h.Bounds) == 0 {
		return math.NaN()
	}
	rank := q * h.Count
	lower, below := 0.0, 0.0
	for i, b := range h.Bounds {
		c := h.Counts[i]
		if c >= rank {
			if math.IsInf(b, 1) {
				return lower
			}
			if c == below {
				return b
			}
			return lower + (b-lower)*(rank-below)/(c-below)
		}
		lower, below = b, c
	}
	return lower
}

// hasLabels reports whether m has every name, value pair of labels.
func hasLabels(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}
