//! rdma_cm ids and channels as a client owns them, and their destruction (one id, or every id
//! of a client that is gone).

use super::*;

impl CmCore {
    /// The client's id `id` (other clients' ids do not exist for it).
    pub(super) fn own(&self, client: u32, id: u32) -> Result<&IdRec, Fail> {
        match self.ids.get(&id) {
            Some(r) if r.client == client => Ok(r),
            _ => Err((libc::EINVAL, "no such rdma_cm id")),
        }
    }

    pub(super) fn own_channel(&self, client: u32, ch: u32) -> bool {
        self.channels.get(&ch).is_some_and(|c| c.client == client)
    }

    pub(super) fn destroy(&mut self, now: Instant, id: u32) {
        self.request_read(id);
        let Some(r) = self.ids.remove(&id) else { return };
        if let (Some(pi), Some(cid)) = (r.device, r.conn) {
            let _ = self.ports[pi].cm.destroy(now, cid);
            self.by_conn.remove(&(pi, cid));
        }
        if let Some(sid) = r.listen_sid {
            let keys: Vec<(usize, u64, u8)> = self.listeners.iter().filter(|(k, &v)| k.1 == sid && v == id).map(|(k, _)| *k).collect();
            for k in keys {
                self.listeners.remove(&k);
                if ![FAM_ANY, 4, 6].iter().any(|&f| self.listeners.contains_key(&(k.0, sid, f))) {
                    let _ = self.ports[k.0].cm.unlisten(sid);
                }
            }
        }
        for c in self.ids.values_mut() {
            if c.parent == Some(id) {
                c.parent = None;
            }
        }
    }

    /// A client is gone: its ids are destroyed (the CM sends DREQ/REJ) and its channels closed.
    pub fn client_gone(&mut self, now: Instant, client: u32) {
        let ids: Vec<u32> = self.ids.iter().filter(|(_, r)| r.client == client).map(|(&h, _)| h).collect();
        for h in ids {
            self.destroy(now, h);
        }
        self.channels.retain(|_, c| c.client != client);
        self.drain_events(now);
    }
}
