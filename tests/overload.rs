//! Issue 17 (first part): overload on one machine must not end connections. 16 QPs x 128
//! outstanding 64 KiB WRITEs on the loopback config ended in RETRY_EXC_ERR (status 12) because
//! the lcore's transmit pass always started at QP slot 0: on a congested port the first QPs
//! filled the burst every iteration and the last ones sent nothing for longer than their
//! retransmission timeout. The pass now starts where the previous one was cut off.
mod common;

use std::time::Duration;

use common::*;

#[test]
fn ib_write_bw_16_qps_deep_queues_all_complete() {
    let _l = heavy_lock();
    let svc = Service::start_loopback();
    for run in 0..2u16 {
        let p = port_for(210 + run).to_string();
        let args = ["ib_write_bw", "-d", "pmrxe0", "-F", "-q", "16", "-t", "128", "-s", "65536", "-n", "3000", "-p", &p];
        let mut client = args.to_vec();
        client.push("127.0.0.1");
        let mut server = args.to_vec();
        server[2] = "pmrxe1";
        let r = run_pair(&svc, &server, &client, 210 + run, Duration::from_secs(120));
        r.assert_ok();
        assert!(!perftest_rows(&r.client.output).is_empty(), "run {run}: no bandwidth row\n{}", r.client.describe());
    }
}
