package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// iperf3Result is the part of `iperf3 -J` (client side) we read.
type iperf3Result struct {
	End struct {
		SumSent struct {
			Seconds     float64 `json:"seconds"`
			Bits        float64 `json:"bits_per_second"`
			Retransmits int     `json:"retransmits"`
		} `json:"sum_sent"`
		SumReceived struct {
			Seconds float64 `json:"seconds"`
			Bits    float64 `json:"bits_per_second"`
		} `json:"sum_received"`
	} `json:"end"`
	Error string `json:"error"`
}

// ParseIperf3 turns a client's `iperf3 -J` output into a tcp Record:
// the receiver's rate (what arrived) and the sender's retransmits.
func ParseIperf3(r io.Reader, target string, rep int) (Record, error) {
	var res iperf3Result
	if err := json.NewDecoder(r).Decode(&res); err != nil {
		return Record{}, fmt.Errorf("reading iperf3 -J output: %w", err)
	}
	if res.Error != "" {
		return Record{}, fmt.Errorf("iperf3: %s", res.Error)
	}
	if res.End.SumReceived.Bits <= 0 || res.End.SumReceived.Seconds <= 0 {
		return Record{}, errors.New("iperf3 output has no end.sum_received (did the test run?)")
	}
	return Record{
		Target:     target,
		Rep:        rep,
		Kind:       KindTCP,
		BitsPerSec: res.End.SumReceived.Bits,
		Seconds:    res.End.SumReceived.Seconds,
		Retrans:    res.End.SumSent.Retransmits,
	}, nil
}

func iperfMain(args []string) error {
	fs := flag.NewFlagSet("iperf3", flag.ContinueOnError)
	target := fs.String("target", "", "label of the path measured")
	rep := fs.Int("rep", 0, "repetition number")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *target == "" {
		return errors.New("-target is required")
	}
	rec, err := ParseIperf3(os.Stdin, *target, *rep)
	if err != nil {
		return err
	}
	return writeRecord(os.Stdout, rec)
}

func infoMain(args []string) error {
	fs := flag.NewFlagSet("info", flag.ContinueOnError)
	target := fs.String("target", "", "label of the path")
	mtu := fs.Int("mtu", 0, "MTU of the client's interface")
	path := fs.String("path", "", "what the traffic crosses")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *target == "" {
		return errors.New("-target is required")
	}
	return writeRecord(os.Stdout, Record{Target: *target, Kind: KindInfo, MTU: *mtu, Path: *path})
}
