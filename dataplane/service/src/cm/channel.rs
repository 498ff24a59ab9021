//! Event channels: one `SOCK_SEQPACKET` socket per channel, a bounded backlog for a client
//! that does not read, and the client's read acknowledgements.

use super::*;

/// Send one datagram without blocking: Ok(true) sent, Ok(false) the socket is full.
pub(super) fn send_dgram(sock: &OwnedFd, bytes: &[u8]) -> std::io::Result<bool> {
    loop {
        match rustix::net::send(sock, bytes, SendFlags::DONTWAIT | SendFlags::NOSIGNAL) {
            Ok(_) => return Ok(true),
            Err(Errno::INTR) => continue,
            Err(Errno::AGAIN) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
    }
}

pub(super) fn flush_backlog(ch: &mut Channel) -> std::io::Result<()> {
    while let Some(b) = ch.backlog.front() {
        if !send_dgram(&ch.sock, b)? {
            return Ok(());
        }
        ch.backlog.pop_front();
    }
    Ok(())
}

/// A `SOCK_SEQPACKET` pair: (service end, client end).
pub(super) fn seqpacket_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    ctrl::seqpacket_pair()
}

impl CmCore {
    /// Retry channel backlogs; drop channels whose client closed its end.
    pub fn housekeeping(&mut self) {
        let mut dead = Vec::new();
        let handles: Vec<u32> = self.channels.keys().copied().collect();
        for h in handles {
            // Read the client's acknowledgements (and see whether it closed its end).
            if !self.read_acks(h) {
                dead.push(h);
                continue;
            }
            if self.channels.get_mut(&h).is_some_and(|ch| flush_backlog(ch).is_err()) {
                dead.push(h);
            }
        }
        for h in dead {
            if let Some(ch) = self.channels.remove(&h) {
                self.stats.events_dropped += ch.backlog.len() as u64;
            }
        }
    }

    pub(super) fn deliver(&mut self, channel: u32, msg: &CmEventMsg) {
        let Some(ch) = self.channels.get_mut(&channel) else {
            self.stats.events_dropped += 1;
            return;
        };
        let Ok(bytes) = ctrl::encode(msg) else {
            self.stats.events_dropped += 1;
            return;
        };
        if flush_backlog(ch).is_err() {
            self.channels.remove(&channel);
            self.stats.events_dropped += 1;
            return;
        }
        if !ch.backlog.is_empty() {
            if ch.backlog.len() >= CHANNEL_BACKLOG {
                self.stats.events_dropped += 1;
            } else {
                ch.backlog.push_back(bytes);
            }
            self.stats.events += 1;
            return;
        }
        match send_dgram(&ch.sock, &bytes) {
            Ok(true) => self.stats.events += 1,
            Ok(false) => {
                ch.backlog.push_back(bytes);
                self.stats.events += 1;
            }
            Err(_) => {
                self.channels.remove(&channel);
                self.stats.events_dropped += 1;
            }
        }
    }

    pub(super) fn event_msg(&self, id: u32, event: u32, status: i32) -> Option<(u32, CmEventMsg)> {
        let r = self.ids.get(&id)?;
        let device = r.device.map(|p| self.ports[p].cfg.device);
        Some((r.channel, CmEventMsg { id, context: r.context, listen_id: None, event, status, device, src: r.src, dst: r.dst, ..Default::default() }))
    }

    pub(super) fn emit(&mut self, id: u32, event: u32, status: i32, conn: Option<CmConnParam>, ud: Option<CmUdParam>) {
        let Some((ch, mut m)) = self.event_msg(id, event, status) else { return };
        if let Some(c) = conn {
            m.conn = c;
        }
        m.ud = ud;
        self.deliver(ch, &m);
    }

    pub(super) fn emit_request(&mut self, id: u32, conn: Option<CmConnParam>, ud: Option<CmUdParam>) {
        let parent = self.ids.get(&id).and_then(|r| r.parent);
        let Some((ch, mut m)) = self.event_msg(id, event::CONNECT_REQUEST, 0) else { return };
        m.listen_id = parent;
        if let Some(c) = conn {
            m.conn = c;
        }
        m.ud = ud;
        self.deliver(ch, &m);
    }

    /// Read the [`ctrl::CmEventAck`]s the client wrote on `channel`. `false`: the client
    /// closed its end.
    pub(super) fn read_acks(&mut self, channel: u32) -> bool {
        let mut read = Vec::new();
        let mut datagrams = 0;
        let alive = match self.channels.get(&channel) {
            Some(ch) => loop {
                if datagrams >= MAX_ACKS_PER_READ {
                    // A client that writes without end does not keep this thread here.
                    break true;
                }
                let mut b = [0u8; 64];
                match rustix::net::recv(&ch.sock, &mut b[..], RecvFlags::DONTWAIT) {
                    Ok((n, _)) if n > 0 => {
                        datagrams += 1;
                        if let Ok(a) = ctrl::decode::<ctrl::CmEventAck>(&b[..n]) {
                            read.push(a.id);
                        }
                        continue;
                    }
                    // EOF, or ECONNRESET when the client closed with events unread: gone.
                    Ok(_) => break false,
                    Err(e) => break e == Errno::AGAIN || e == Errno::INTR,
                }
            },
            None => return false,
        };
        let owner = self.channels.get(&channel).map(|c| c.client);
        for id in read {
            if self.ids.get(&id).map(|r| r.client) == owner {
                self.request_read(id);
            }
        }
        alive
    }
}
