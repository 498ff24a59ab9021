//! Per-QP counters (one per protocol event, rxe `RXE_CNT_*` style). Plain `u64`s: the QP is
//! owned by one lcore.

use crate::cq::WcStatus;

/// Counters of one QP. Summed by [`crate::Engine::stats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QpStats {
    /// Request packets sent (first transmissions and retransmissions).
    pub tx_packets: u64,
    /// Payload bytes sent.
    pub tx_bytes: u64,
    /// Packets handed to `handle_packet`.
    pub rx_packets: u64,
    /// Of those, WRITE MIDDLE packets the responder took in one step (its fast path for a
    /// write in progress at the expected PSN).
    pub rx_fast_path: u64,
    /// Of `tx_packets`, MIDDLE packets the requester built in one step (its fast path for a
    /// message in progress).
    pub tx_fast_path: u64,
    /// Packets retransmitted by go-back-N.
    pub retransmits: u64,
    /// Payload bytes retransmitted by go-back-N.
    pub retransmit_bytes: u64,
    /// CE-marked packets received (ECN congestion experienced).
    pub ecn_ce_received: u64,
    /// CNPs sent by the notification point (at most one per QP per CNP interval).
    pub cnp_sent: u64,
    /// CNPs received for this QP (reaction point).
    pub cnp_received: u64,
    /// DCQCN rate decreases applied.
    pub cc_rate_decreases: u64,
    /// Current DCQCN rate Rc in Mb/s (a gauge: line rate when not limiting, 0 with DCQCN off;
    /// summed by `add`).
    pub cc_rate_mbps: u64,
    /// Go-back-N retries started (timeout, sequence NAK, implicit NAK, RNR).
    pub retries: u64,
    /// Local ACK timer expirations (each one retries or, with the retry count spent, fails).
    pub timeouts: u64,
    /// Nanoseconds spent in retransmission back-off: from a local ACK timeout until the next
    /// forward progress (or the retry-exceeded failure).
    pub backoff_ns: u64,
    /// PSN sequence NAKs sent by our responder.
    pub seq_naks_sent: u64,
    /// PSN sequence NAKs received by our requester.
    pub seq_naks_received: u64,
    /// RNR NAKs sent.
    pub rnr_naks_sent: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// Other NAKs sent (invalid request, remote access, remote op).
    pub err_naks_sent: u64,
    /// Other NAKs received.
    pub err_naks_received: u64,
    /// ACK packets sent (incl. atomic ACKs).
    pub acks_sent: u64,
    /// ACK packets received.
    pub acks_received: u64,
    /// READ response packets sent.
    pub read_responses_sent: u64,
    /// Duplicate requests seen by the responder.
    pub duplicates: u64,
    /// Duplicate READ requests replayed.
    pub read_replays: u64,
    /// Duplicate atomics answered from the saved result.
    pub atomic_replays: u64,
    /// Out-of-sequence requests (PSN ahead of expected).
    pub out_of_sequence: u64,
    /// rkey/range/access violations at the responder.
    pub rkey_violations: u64,
    /// Bytes the responder wrote into memory (WRITE, SEND, atomics).
    pub resp_bytes_written: u64,
    /// Local operations executed (REG_MR, LOCAL_INV, BIND_MW). Each WQE counts once.
    pub local_op_executions: u64,
    /// Local operations skipped on replay (network cursor behind the execution cursor).
    pub local_op_replay_skips: u64,
    /// Local operations executed a second time. Invariant: always 0.
    pub local_op_reexecutions: u64,
    /// Packets dropped (bad state, bad header, unexpected response, ...).
    pub dropped: u64,
    /// Packets dropped for a bad ICRC found by the QP (checks deferred by the receiver:
    /// `RxPacket::icrc`).
    pub icrc_errors: u64,
    /// Retry count exhausted.
    pub retry_exceeded: u64,
    /// RNR retry count exhausted.
    pub rnr_retry_exceeded: u64,
    /// Completions by `ibv_wc_status` value.
    pub completions: [u64; WcStatus::COUNT],
}

impl QpStats {
    /// Count a completion.
    pub fn completion(&mut self, s: WcStatus) {
        self.completions[s as usize] += 1;
    }
    /// Add `o` into `self`.
    pub fn add(&mut self, o: &QpStats) {
        macro_rules! sum { ($($f:ident),*) => { $( self.$f += o.$f; )* } }
        sum!(
            tx_packets, tx_bytes, tx_fast_path, rx_packets, rx_fast_path, retransmits, retransmit_bytes, ecn_ce_received,
            cnp_sent, cnp_received, cc_rate_decreases, cc_rate_mbps, retries, timeouts, backoff_ns, seq_naks_sent,
            seq_naks_received, rnr_naks_sent, rnr_naks_received, err_naks_sent,
            err_naks_received, acks_sent, acks_received, read_responses_sent, duplicates,
            read_replays, atomic_replays, out_of_sequence, rkey_violations, resp_bytes_written,
            local_op_executions, local_op_replay_skips, local_op_reexecutions, dropped, icrc_errors,
            retry_exceeded, rnr_retry_exceeded
        );
        for (a, b) in self.completions.iter_mut().zip(o.completions.iter()) {
            *a += b;
        }
    }
}
