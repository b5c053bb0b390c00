// Package forward answers every name outside the cluster zone by asking the
// node's upstream resolvers, through a bounded positive and negative cache.
//
// Design:
//   - Upstreams come from the node's resolv.conf (nameserver lines, port 53) or
//     an explicit list. Loopback resolvers are kept (the agent lives in the
//     node's namespace, where 127.0.0.53 is systemd-resolved, not itself); the
//     server's own addresses are dropped to avoid a forwarding loop. See
//     UpstreamsFromResolvConf.
//   - Exchange tries upstreams in order, each try bounded by a per-try timeout
//     (2 s) and the whole call by the caller's context. A try asks over UDP with
//     an EDNS0 buffer of 1232 bytes (the DNS flag day 2020 size, no IP
//     fragmentation) and repeats over TCP when the answer comes back truncated.
//     A network error, a timeout, SERVFAIL or REFUSED moves on to the next
//     upstream; if every upstream failed that way, the last SERVFAIL/REFUSED
//     answer is returned, else an error.
//   - The answer carries the client's ID and question (its letter case
//     included). The upstream's OPT record is removed: EDNS0 towards the client
//     (its buffer size, truncation, the OPT in the reply) is the server's job.
//   - The cache is an LRU bounded in entries, keyed by lowercased name, type,
//     class and the DO and CD bits. See Cache.Set for what is cached and for
//     how long; served TTLs are lowered by the entry's age.
//   - Cluster names never reach this package: the server decides what is
//     forwarded.
//   - Stats are plain counters; Prometheus wiring reads them later.
package forward
