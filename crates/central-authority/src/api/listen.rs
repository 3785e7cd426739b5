//! What the HTTPS and gRPC listeners share against a hostile crowd:
//! admission (a cap on connections per source address, and the choice of
//! which idle connection gives way when the HTTPS listener is full) and
//! [`Deadlines`], a stream wrapper that closes a connection that sends
//! nothing: no first byte within `first_byte_timeout`, or no byte for
//! `idle_timeout` while no request is in flight. The wrapper sits under
//! hyper-util's protocol sniffing and HTTP/2, which have no such deadline
//! of their own.
//!
//! Owner of its state (the per-source counts and the idle connections).

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

use crate::ground::sync::lock;

/// Connection accounting of one listener.
///
/// A request starting or ending touches only its connection's atomics (no
/// lock: on a saturated machine a worker preempted while holding a lock
/// every request takes stalls the others); the lock is taken when a
/// connection opens or closes and when the listener, full, looks for the
/// connection idle longest (a scan of at most `max_connections`).
#[derive(Debug)]
pub struct Admission {
    per_source_cap: usize,
    inner: Mutex<Inner>,
    /// What `Conn::idle_since` counts from.
    epoch: Instant,
}

#[derive(Debug, Default)]
struct Inner {
    /// Open connections per source address (no entry: none).
    per_source: HashMap<IpAddr, usize>,
    /// Every open connection, by id.
    open: HashMap<u64, Arc<Conn>>,
    next: u64,
}

/// What the listener and a connection share.
#[derive(Debug)]
struct Conn {
    evict: Notify,
    in_flight: AtomicUsize,
    /// When it last moved a byte or ended a request, in nanoseconds from
    /// `Admission::epoch` (a relaxed store into the connection's own
    /// atomic: no shared counter on the hot path).
    idle_since: AtomicU64,
    /// Asked to close already (not chosen again).
    evicted: AtomicBool,
    /// Admitted without a slot, waiting for its first byte: it holds no
    /// slot to give up, so it is never asked to.
    waiting: AtomicBool,
    /// Closed by the CA for silence (given way, or timed out): the TCP
    /// stream is reset rather than closed ([`Accepted`]).
    reset: AtomicBool,
}

impl Admission {
    /// Accounting with at most `per_source_cap` connections per address.
    pub fn new(per_source_cap: usize) -> Arc<Self> {
        Arc::new(Admission {
            per_source_cap: per_source_cap.max(1),
            inner: Mutex::new(Inner::default()),
            epoch: Instant::now(),
        })
    }

    /// `at` on the idle clock.
    fn since_epoch(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Admits a connection from `source`, idle until its first request;
    /// `None` when the source already has its cap of connections open.
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> Option<Ticket> {
        let mut inner = lock(&self.inner);
        let open = inner.per_source.entry(source).or_insert(0);
        if *open >= self.per_source_cap {
            return None;
        }
        *open += 1;
        inner.next += 1;
        let id = inner.next;
        let conn = Arc::new(Conn {
            evict: Notify::new(),
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(self.since_epoch(Instant::now())),
            evicted: AtomicBool::new(false),
            waiting: AtomicBool::new(false),
            reset: AtomicBool::new(false),
        });
        inner.open.insert(id, conn.clone());
        Some(Ticket {
            admission: self.clone(),
            source,
            id,
            conn,
        })
    }

    /// Asks the `n` connections idle longest to close (to make room for
    /// as many new ones), in one scan of the open connections; returns how
    /// many were asked (fewer when the rest are busy, waiting for a slot
    /// or already asked).
    pub fn evict_idle(&self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        let inner = lock(&self.inner);
        let mut idle: Vec<(u64, &Arc<Conn>)> = inner
            .open
            .iter()
            .filter(|(_, c)| {
                c.in_flight.load(Ordering::Acquire) == 0
                    && !c.evicted.load(Ordering::Relaxed)
                    && !c.waiting.load(Ordering::Relaxed)
            })
            .map(|(_, c)| (c.idle_since.load(Ordering::Relaxed), c))
            .collect();
        if idle.len() > n {
            idle.select_nth_unstable_by_key(n, |(since, _)| *since);
            idle.truncate(n);
        }
        for (_, conn) in &idle {
            conn.evicted.store(true, Ordering::Relaxed);
            conn.reset.store(true, Ordering::Relaxed);
            // `notify_one` keeps the signal if the connection is not
            // waiting on it yet.
            conn.evict.notify_one();
        }
        idle.len()
    }

    /// Open connections from `source` (tests).
    pub fn open_from(&self, source: IpAddr) -> usize {
        lock(&self.inner)
            .per_source
            .get(&source)
            .copied()
            .unwrap_or(0)
    }
}

/// One admitted connection: counted against its source until dropped.
#[derive(Debug)]
pub struct Ticket {
    admission: Arc<Admission>,
    source: IpAddr,
    id: u64,
    conn: Arc<Conn>,
}

impl Ticket {
    /// Resolves when the listener needs this (idle) connection's slot.
    pub fn evicted(&self) -> impl Future<Output = ()> + '_ {
        self.conn.evict.notified()
    }

    /// Marks a request in flight until the guard drops: the connection is
    /// neither evicted nor closed as idle meanwhile.
    pub fn busy(self: &Arc<Self>) -> Busy {
        self.conn.in_flight.fetch_add(1, Ordering::AcqRel);
        Busy(self.clone())
    }

    /// Records that the connection moved a byte (or finished its TLS
    /// handshake, or a request) at `at`: the connection idle longest is
    /// the one that has been silent longest.
    pub fn touch_at(&self, at: Instant) {
        let since = self.admission.since_epoch(at);
        self.conn.idle_since.store(since, Ordering::Relaxed);
    }

    /// Whether a request is in flight.
    pub fn is_busy(&self) -> bool {
        self.conn.in_flight.load(Ordering::Acquire) > 0
    }

    /// Marks the connection as closed for silence: its stream is reset
    /// when dropped ([`Accepted`]).
    pub fn reset_on_close(&self) {
        self.conn.reset.store(true, Ordering::Relaxed);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut inner = lock(&self.admission.inner);
        inner.open.remove(&self.id);
        if let Some(open) = inner.per_source.get_mut(&self.source) {
            *open = open.saturating_sub(1);
            if *open == 0 {
                inner.per_source.remove(&self.source);
            }
        }
    }
}

/// A request in flight on a connection ([`Ticket::busy`]).
#[derive(Debug)]
pub struct Busy(Arc<Ticket>);

impl Drop for Busy {
    fn drop(&mut self) {
        let ticket = &self.0;
        if ticket.conn.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            ticket.touch_at(Instant::now());
        }
    }
}

/// A stream that fails reads with `TimedOut` when its peer sends no first
/// byte within `first_byte`, or, after that, moves no byte for `idle` while
/// its connection has no request in flight.
#[derive(Debug)]
pub struct Deadlines<S> {
    io: S,
    ticket: Arc<Ticket>,
    deadline: Pin<Box<Sleep>>,
    started: bool,
    idle: Duration,
}

impl<S> Deadlines<S> {
    /// Wraps `io`, whose first byte is due within `first_byte`.
    pub fn new(io: S, ticket: Arc<Ticket>, first_byte: Duration, idle: Duration) -> Self {
        Deadlines {
            io,
            ticket,
            deadline: Box::pin(tokio::time::sleep(first_byte)),
            started: false,
            idle,
        }
    }

    fn moved(&mut self) {
        self.started = true;
        let (idle, now) = (self.idle, Instant::now());
        self.ticket.touch_at(now);
        self.deadline.as_mut().reset(now + idle);
    }

    /// Pending until the deadline passes with no request in flight.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Error> {
        loop {
            if self.deadline.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if self.started && self.ticket.is_busy() {
                // A handler is working (an access request waiting for
                // discovery): not idle.
                let idle = self.idle;
                self.deadline.as_mut().reset(Instant::now() + idle);
                continue;
            }
            let what = if self.started {
                "idle timeout"
            } else {
                "no first byte in time"
            };
            self.ticket.reset_on_close();
            return Poll::Ready(std::io::Error::new(std::io::ErrorKind::TimedOut, what));
        }
    }
}

/// `AsyncRead`'s method, passed on to the wrapper's `io` field unchanged
/// (wrappers that only hold a slot, or only rewrite what is written).
macro_rules! forward_reads {
    () => {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
        }
    };
}

/// `AsyncWrite`'s methods, each passed on to the wrapper's `io` field
/// unchanged (wrappers that only watch reads, or only hold a slot).
macro_rules! forward_writes {
    () => {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
        }

        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.get_mut().io).poll_flush(cx)
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
        }

        fn is_write_vectored(&self) -> bool {
            self.io.is_write_vectored()
        }
    };
}

/// A stream that gives hyper's own error answers a body: when hyper refuses
/// a request it could not parse (400, 431 for a head over its buffer, 414,
/// 505, ...) it writes a bare head with `content-length: 0`, before any
/// service runs. Such a head (a 4xx or 5xx status with no body: the CA's
/// own error answers always carry the JSON error) is rewritten here into
/// the API's JSON error with the same status. Writes are never vectored,
/// so hyper hands over each head whole.
#[derive(Debug)]
pub struct JsonErrors<S> {
    io: S,
    /// Bytes of a rewritten head still to write.
    pending: Vec<u8>,
    written: usize,
}

impl<S> JsonErrors<S> {
    /// Wraps `io`.
    pub fn new(io: S) -> Self {
        JsonErrors {
            io,
            pending: Vec::new(),
            written: 0,
        }
    }
}

/// `buf` as the API's JSON error when it is a bare error head of hyper's.
fn json_error_head(buf: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(buf).ok()?;
    let head = text.strip_suffix("\r\n\r\n")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let mut words = status_line.splitn(3, ' ');
    let (version, code) = (words.next()?, words.next()?);
    if !version.starts_with("HTTP/1.") || !matches!(code.as_bytes().first(), Some(b'4' | b'5')) {
        return None;
    }
    let headers: Vec<&str> = lines.collect();
    let is_length = |h: &str| {
        h.split_once(':')
            // hyper writes header names in lower case.
            .is_some_and(|(k, _)| k.trim() == "content-length")
    };
    if !headers
        .iter()
        .filter(|h| is_length(h))
        .all(|h| h.split_once(':').is_some_and(|(_, v)| v.trim() == "0"))
    {
        return None;
    }
    let message = match code {
        "400" => "malformed HTTP request",
        "413" => "request body too large",
        "414" => "request URI too long",
        "431" => "request header fields too large",
        "505" => "HTTP version not supported",
        _ => "request refused",
    };
    let reason = if code.starts_with('5') {
        "internal"
    } else {
        "invalid_request"
    };
    let body = serde_json::json!({"error": {"reason": reason, "message": message}}).to_string();
    let mut out = format!(
        "{status_line}\r\ncontent-type: application/json\r\ncache-control: no-store\r\n\
         x-content-type-options: nosniff\r\ncontent-length: {}\r\n",
        body.len()
    );
    for h in headers.iter().filter(|h| !is_length(h)) {
        out.push_str(h);
        out.push_str("\r\n");
    }
    out.push_str("\r\n");
    out.push_str(&body);
    Some(out.into_bytes())
}

impl<S: AsyncRead + Unpin> AsyncRead for JsonErrors<S> {
    forward_reads!();
}

impl<S: AsyncWrite + Unpin> JsonErrors<S> {
    /// Writes what is left of a rewritten head; ready when it is all out.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while self.written < self.pending.len() {
            let n = std::task::ready!(
                Pin::new(&mut self.io).poll_write(cx, &self.pending[self.written..])
            )?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.pending.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for JsonErrors<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        std::task::ready!(this.drain(cx))?;
        if let Some(rewritten) = json_error_head(buf) {
            this.pending = rewritten;
            // The caller's bytes are taken; the rewrite goes out now or on
            // the next write, flush or shutdown.
            let _ = this.drain(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.drain(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.drain(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

/// A stream under a TLS handshake that records every byte it reads on its
/// connection's ticket ([`Ticket::touch_at`]): a client in the middle of
/// its handshake is not idle, one that sent a few bytes long ago is.
/// [`Handshaking::done`] stops it once the handshake is over ([`Deadlines`]
/// records movement from then on).
#[derive(Debug)]
pub struct Handshaking<S> {
    io: S,
    ticket: Option<Arc<Ticket>>,
}

impl<S> Handshaking<S> {
    /// Wraps `io`, recording its reads on `ticket`.
    pub fn new(io: S, ticket: Arc<Ticket>) -> Self {
        Handshaking {
            io,
            ticket: Some(ticket),
        }
    }

    /// Stops recording.
    pub fn done(&mut self) {
        self.ticket = None;
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Handshaking<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if let (Poll::Ready(Ok(())), Some(ticket)) = (&read, &this.ticket)
            && buf.filled().len() > before
        {
            ticket.touch_at(Instant::now());
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Handshaking<S> {
    forward_writes!();
}

impl<S: AsyncRead + Unpin> AsyncRead for Deadlines<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.moved();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.poll_deadline(cx).map(Err),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Deadlines<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.io).poll_write(cx, buf);
        if this.started && matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            this.moved();
        }
        written
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        if this.started && matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            this.moved();
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// An accepted HTTPS connection's TCP stream. Dropped after the CA gave
/// up on the connection for silence (asked it to give way, or its first
/// byte or an idle deadline passed: [`Ticket::reset_on_close`]), it is
/// reset (`SO_LINGER` 0: an RST) rather than closed: no `TIME_WAIT` socket
/// on the CA's side, and a connection-tracking entry that expires in
/// seconds, not minutes. Against a crowd reopening whatever it lost, FINs
/// overflowed the host's `TIME_WAIT` table (560,000 overflows in one run).
#[derive(Debug)]
pub struct Accepted {
    io: tokio::net::TcpStream,
    ticket: Arc<Ticket>,
}

impl Accepted {
    /// Wraps `io`, admitted with `ticket`.
    pub fn new(io: tokio::net::TcpStream, ticket: Arc<Ticket>) -> Self {
        Accepted { io, ticket }
    }

    /// Whether the peer sends its first byte within `within` (left
    /// unread); when it does not, the stream is marked for a reset.
    pub async fn heard_within(&self, within: Duration) -> bool {
        let mut first = [0u8; 1];
        let heard = matches!(
            tokio::time::timeout(within, self.io.peek(&mut first)).await,
            Ok(Ok(n)) if n > 0
        );
        if !heard {
            self.ticket.reset_on_close();
        }
        heard
    }
}

impl Drop for Accepted {
    fn drop(&mut self) {
        if self.ticket.conn.reset.load(Ordering::Relaxed) {
            let _ = self.io.set_zero_linger();
        }
    }
}

impl AsyncRead for Accepted {
    forward_reads!();
}

impl AsyncWrite for Accepted {
    forward_writes!();
}

/// A gRPC connection admitted by the accept loop: the TCP stream with its
/// slot (global permit and per-source ticket), released when tonic drops
/// the connection.
#[derive(Debug)]
pub struct Admitted {
    io: tokio::net::TcpStream,
    _permit: tokio::sync::OwnedSemaphorePermit,
    _ticket: Ticket,
}

impl Admitted {
    /// Wraps an accepted stream with its slot.
    pub fn new(
        io: tokio::net::TcpStream,
        permit: tokio::sync::OwnedSemaphorePermit,
        ticket: Ticket,
    ) -> Self {
        Admitted {
            io,
            _permit: permit,
            _ticket: ticket,
        }
    }
}

impl Admitted {
    /// The peer's address (for logs).
    fn peer(&self) -> Option<SocketAddr> {
        self.io.peer_addr().ok()
    }
}

impl tonic::transport::server::Connected for Admitted {
    // The TCP stream's own: `Request::remote_addr` reads it, and over TLS
    // tonic's `TlsStream<Admitted>` gives `TlsConnectInfo<TcpConnectInfo>`,
    // which is what `Request::peer_certs` looks for.
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl AsyncRead for Admitted {
    forward_reads!();
}

impl AsyncWrite for Admitted {
    forward_writes!();
}

/// The least backlog a listener asks for (`listen(2)`'s backlog: how
/// many connections the kernel holds for it before it accepts them).
/// `tokio::net::TcpListener::bind` asks for 128, as the standard library
/// does: when the HTTPS listener is full and a crowd of idle connections
/// waits to be accepted, a queue of 128 overflows and the kernel drops new
/// connections' SYNs, which a client retries only after a second.
pub const LISTEN_BACKLOG: u32 = 4096;

/// The backlog of a listener that serves at most `limit` connections at
/// once: at least [`LISTEN_BACKLOG`], and room for as many waiting as it
/// serves (a crowd as large as the limit waits in line, not in SYN
/// retries).
pub fn backlog(limit: usize) -> u32 {
    u32::try_from(limit).unwrap_or(u32::MAX).max(LISTEN_BACKLOG)
}

/// The kernel's cap on every listener's backlog (`net.core.somaxconn`);
/// `None` where it cannot be read.
pub fn somaxconn() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// The warning for a listener (`what`, its connection limit `key` =
/// `limit`) whose backlog the kernel's cap `somaxconn` cuts below that
/// limit; `None` when it does not.
pub fn backlog_warning(what: &str, key: &str, limit: usize, somaxconn: u32) -> Option<String> {
    let limit_u32 = u32::try_from(limit).unwrap_or(u32::MAX);
    (somaxconn < limit_u32).then(|| {
        format!(
            "net.core.somaxconn is {somaxconn}, below [limits] {key} = {limit}: the {what} \
             listener's backlog is cut to {somaxconn}, and past it new connections' SYNs are \
             dropped (retried after a second); raise it with `sysctl -w \
             net.core.somaxconn={}`",
            backlog(limit)
        )
    })
}

/// A listener on `addr` with a backlog of `backlog` (see [`backlog`]), as
/// both of the CA's listeners are bound.
pub fn bind(addr: SocketAddr, backlog: u32) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// The HTTPS listener's accepting side: at most `max` connections served
/// at once (each holds a slot), at most `per_source` from one address, and
/// as many as the listener's backlog ([`backlog`]) waiting for a slot
/// ([`Seats`]).
///
/// A connection that finds every slot taken waits, holding none, for its
/// first byte (within the first-byte timeout); only once it has spoken
/// does the connection idle longest give way to it. A silent crowd larger
/// than the limit therefore waits out its deadline instead of evicting
/// itself in a loop: when every new silent connection evicted an idle one,
/// a crowd of 2,200 reopening what it lost churned through 13,000
/// connections a second, filled the host's connection-tracking table and
/// the kernel dropped new users' SYNs (p99 of an access request 1-7 s).
/// Each wake of the listener takes every connection in the kernel's queue.
#[derive(Debug)]
pub struct Acceptor {
    listener: tokio::net::TcpListener,
    seats: Seats,
    max: usize,
}

/// The slots and waiting places of an [`Acceptor`], for the tasks of the
/// connections it took (which must not hold the listening socket open).
#[derive(Clone, Debug)]
pub struct Seats {
    slots: Arc<tokio::sync::Semaphore>,
    waiting: Arc<tokio::sync::Semaphore>,
    admission: Arc<Admission>,
}

/// A connection taken by one wake of the listener, with its ticket.
pub type Taken = (tokio::net::TcpStream, SocketAddr, Ticket);

impl Acceptor {
    /// Accepts on `listener`.
    pub fn new(listener: tokio::net::TcpListener, max: usize, per_source: usize) -> Self {
        Acceptor {
            listener,
            seats: Seats {
                slots: Arc::new(tokio::sync::Semaphore::new(max.max(1))),
                waiting: Arc::new(tokio::sync::Semaphore::new(backlog(max) as usize)),
                admission: Admission::new(per_source),
            },
            max: max.max(1),
        }
    }

    /// Its slots and waiting places.
    pub fn seats(&self) -> &Seats {
        &self.seats
    }

    /// Waits for a connection, takes with it every other one waiting and
    /// admits each (one over its source's cap is closed at once). Accept
    /// errors (out of file descriptors) back off and keep accepting.
    pub async fn next(&self) -> Vec<Taken> {
        use futures::FutureExt as _;
        let mut raw = Vec::new();
        while raw.is_empty() {
            match self.listener.accept().await {
                Ok(a) => raw.push(a),
                Err(e) => {
                    tracing::debug!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        // The rest of the queue, without waiting.
        while raw.len() < self.max {
            match self.listener.accept().now_or_never() {
                Some(Ok(a)) => raw.push(a),
                Some(Err(_)) | None => break,
            }
        }
        let mut taken = Vec::with_capacity(raw.len());
        for (tcp, peer) in raw {
            match self.seats.admission.admit(peer.ip()) {
                Some(ticket) => taken.push((tcp, peer, ticket)),
                None => tracing::debug!(%peer, "HTTPS: connection over the per-source cap closed"),
            }
        }
        taken
    }
}

impl Seats {
    /// A free slot, if there is one.
    pub fn try_seat(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().ok()
    }

    /// A place to wait for a slot in (for [`Seats::seat_once_heard`]),
    /// marking `ticket` as waiting: when every place is taken, at once
    /// when one frees (meanwhile new connections wait in the kernel's
    /// queue).
    pub async fn waiting_place(
        &self,
        ticket: &Ticket,
    ) -> Option<tokio::sync::OwnedSemaphorePermit> {
        ticket.conn.waiting.store(true, Ordering::Relaxed);
        self.waiting.clone().acquire_owned().await.ok()
    }

    /// A slot for a waiting connection once it sends its first byte within
    /// `first_byte`: the connection idle longest is asked to close when no
    /// slot is free. `None` (the stream marked for a reset) when it stays
    /// silent.
    pub async fn seat_once_heard(
        &self,
        tcp: &Accepted,
        first_byte: Duration,
    ) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if !tcp.heard_within(first_byte).await {
            return None;
        }
        if self.slots.available_permits() == 0 {
            self.admission.evict_idle(1);
        }
        let slot = self.slots.clone().acquire_owned().await.ok()?;
        tcp.ticket.conn.waiting.store(false, Ordering::Relaxed);
        Some(slot)
    }
}

/// The gRPC listener's accepted connections: at most `max` open at once
/// (more wait in the kernel's accept queue), at most `per_source` from one
/// address (more are closed at once). Accept errors (out of file
/// descriptors) back off and keep serving.
pub fn grpc_incoming(
    listener: tokio::net::TcpListener,
    max: usize,
    per_source: usize,
) -> impl futures::Stream<Item = Result<Admitted, std::io::Error>> {
    let slots = Arc::new(tokio::sync::Semaphore::new(max.max(1)));
    let admission = Admission::new(per_source);
    futures::stream::unfold(
        (listener, slots, admission),
        |(listener, slots, admission)| async move {
            loop {
                let Ok(permit) = slots.clone().acquire_owned().await else {
                    return None;
                };
                let (tcp, peer): (tokio::net::TcpStream, SocketAddr) = match listener.accept().await
                {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::debug!(error = %e, "gRPC accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Some(ticket) = admission.admit(peer.ip()) else {
                    tracing::debug!(%peer, "gRPC: connection over the per-source cap closed");
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                let admitted = Admitted::new(tcp, permit, ticket);
                return Some((Ok(admitted), (listener, slots, admission)));
            }
        },
    )
}

/// The gRPC listener's connections over TLS: each admitted connection's
/// handshake runs on a task of its own (a slow or silent client holds up
/// no other), with the server configuration `config` gives when the
/// connection arrives (a reload replaces it: new handshakes get the new
/// certificate and trusted roots, connections open before keep theirs),
/// and must finish within `handshake`; one that fails or times out is
/// closed (logged at debug). Yields the connections whose handshake
/// succeeded, in the order they finish; a connection keeps its slot
/// (`Admitted`) through its handshake.
pub fn grpc_tls_incoming<S>(
    admitted: S,
    config: impl Fn() -> Option<Arc<rustls::ServerConfig>> + Send + 'static,
    handshake: Duration,
) -> impl futures::Stream<Item = Result<tokio_rustls::server::TlsStream<Admitted>, std::io::Error>>
where
    S: futures::Stream<Item = Result<Admitted, std::io::Error>> + Send + 'static,
{
    use futures::StreamExt as _;
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        let mut admitted = std::pin::pin!(admitted);
        loop {
            // The server stopped taking connections: stop accepting.
            let next = tokio::select! {
                () = tx.closed() => return,
                next = admitted.next() => next,
            };
            let conn = match next {
                None => return,
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "gRPC accept failed");
                    continue;
                }
                Some(Ok(conn)) => conn,
            };
            let Some(config) = config() else {
                continue;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let peer = conn.peer();
                let acceptor = tokio_rustls::TlsAcceptor::from(config);
                match tokio::time::timeout(handshake, acceptor.accept(conn)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(?peer, error = %e, "gRPC: TLS handshake failed");
                    }
                    Err(_) => tracing::debug!(?peer, "gRPC: TLS handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// The address a request came from (a request extension the listener
/// sets; absent when the router is called directly, as in unit tests).
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub std::net::SocketAddr);

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    const A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

    /// A listener the CA binds keeps every connection a crowd opens
    /// before it accepts any, up to the kernel's cap: with the default
    /// backlog of 128 the rest had their SYNs dropped and waited a second
    /// for the retry.
    #[tokio::test]
    async fn a_bound_listener_queues_more_connections_than_the_default_backlog() {
        let somaxconn = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(4096);
        // Past 128 with room to spare, within the kernel's cap and the
        // test's open-file limit.
        let n = somaxconn.min(LISTEN_BACKLOG as usize).min(400);
        assert!(
            n > 200,
            "net.core.somaxconn is {somaxconn}: this test needs more than 200 \
             (`sysctl net.core.somaxconn=4096`) to tell the backlogs apart"
        );
        let listener = bind((A, 0).into(), backlog(1)).expect("bind");
        let addr = listener.local_addr().expect("address");
        let mut clients = Vec::new();
        for i in 0..n {
            let connected = tokio::time::timeout(
                Duration::from_millis(500),
                tokio::net::TcpStream::connect(addr),
            )
            .await;
            match connected {
                Ok(Ok(c)) => clients.push(c),
                other => panic!("connection {i} of {n} not queued: {other:?}"),
            }
        }
        assert_eq!(clients.len(), n);
        drop(listener);
    }

    /// The backlog is never under the default and grows with the limit;
    /// a kernel cap under the limit is warned about, naming both.
    #[test]
    fn the_backlog_follows_the_connection_limit() {
        assert_eq!(backlog(1024), LISTEN_BACKLOG);
        assert_eq!(backlog(20_000), 20_000);
        assert_eq!(backlog(usize::MAX), u32::MAX);
        assert_eq!(backlog_warning("HTTP", "max_connections", 1024, 4096), None);
        let w = backlog_warning("HTTP", "max_connections", 1024, 128).expect("warned");
        assert!(
            w.contains("somaxconn is 128") && w.contains("max_connections = 1024"),
            "{w}"
        );
    }

    /// The listen queue's length of the listener on `port` (its
    /// `rx_queue` in /proc/net/tcp: connections handshaken, not accepted).
    fn accept_queue(port: u16) -> usize {
        let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
        let local = format!(":{port:04X}");
        table
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.len() > 4 && f[1].ends_with(&local) && f[3] == "0A")
            .and_then(|f| f[4].split(':').nth(1).map(str::to_owned))
            .and_then(|rx| usize::from_str_radix(&rx, 16).ok())
            .expect("the listener in /proc/net/tcp")
    }

    /// Holds an accepted connection as the HTTPS server does: until the
    /// listener asks it to close.
    fn hold(tcp: tokio::net::TcpStream, ticket: Ticket, permit: tokio::sync::OwnedSemaphorePermit) {
        tokio::spawn(async move {
            ticket.evicted().await;
            drop((tcp, permit, ticket));
        });
    }

    /// Reads `c` for `within`: whether the server closed it (EOF or reset).
    async fn closed(c: &mut tokio::net::TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(within, tokio::io::AsyncReadExt::read(c, &mut buf)).await;
        matches!(read, Ok(Ok(0)) | Ok(Err(_)))
    }

    /// Takes one wake's `k` connections (all queued first).
    async fn take(acceptor: &Acceptor, port: u16, k: usize) -> Vec<Taken> {
        while accept_queue(port) < k {
            tokio::task::yield_now().await;
        }
        let taken = acceptor.next().await;
        assert_eq!(taken.len(), k, "the whole queue in one wake");
        taken
    }

    /// A listener full of idle connections: a burst of `K` silent ones
    /// waits without a slot and makes none give way, then is reset at its
    /// first-byte deadline; a burst of `K` that speak makes the `K` idle
    /// longest give way, and each gets a slot.
    #[tokio::test]
    async fn only_a_connection_that_speaks_makes_an_idle_one_give_way() {
        use tokio::io::AsyncWriteExt;
        const LIMIT: usize = 16;
        const K: usize = 8;
        let listener = bind((A, 0).into(), backlog(LIMIT)).expect("bind");
        let addr = listener.local_addr().expect("address");
        let acceptor = Acceptor::new(listener, LIMIT, 1_000);
        let mut crowd = Vec::new();
        while crowd.len() < LIMIT {
            crowd.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
            for (tcp, _, ticket) in acceptor.next().await {
                hold(
                    tcp,
                    ticket,
                    acceptor.seats().try_seat().expect("a free slot"),
                );
            }
        }
        assert!(acceptor.seats().try_seat().is_none(), "full");
        let wait = |tcp, ticket: Ticket, first_byte| {
            let seats = acceptor.seats().clone();
            tokio::spawn(async move {
                let ticket = Arc::new(ticket);
                let _place = seats.waiting_place(&ticket).await.expect("a place");
                let tcp = Accepted::new(tcp, ticket.clone());
                let slot = seats.seat_once_heard(&tcp, first_byte).await;
                (tcp, slot)
            })
        };

        let mut silent = Vec::new();
        for _ in 0..K {
            silent.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
        }
        let mut waiters = Vec::new();
        for (tcp, _, ticket) in take(&acceptor, addr.port(), K).await {
            waiters.push(wait(tcp, ticket, Duration::from_millis(200)));
        }
        for w in waiters {
            let (_, slot) = w.await.expect("waiter");
            assert!(slot.is_none(), "a silent connection got a slot");
        }
        for (i, c) in crowd.iter_mut().enumerate() {
            assert!(
                !closed(c, Duration::from_millis(20)).await,
                "{i} gave way to silence"
            );
        }
        for (i, c) in silent.iter_mut().enumerate() {
            assert!(
                closed(c, Duration::from_secs(5)).await,
                "silent {i} still open"
            );
        }

        let mut talkers = Vec::new();
        for _ in 0..K {
            let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
            c.write_all(b"x").await.expect("write");
            talkers.push(c);
        }
        let mut waiters = Vec::new();
        for (tcp, _, ticket) in take(&acceptor, addr.port(), K).await {
            waiters.push(wait(tcp, ticket, Duration::from_secs(10)));
        }
        let mut seated = Vec::new();
        for w in waiters {
            let (tcp, slot) = tokio::time::timeout(Duration::from_secs(10), w)
                .await
                .expect("seated in time")
                .expect("waiter");
            seated.push((tcp, slot.expect("a slot from an idle connection")));
        }
        // The K idle longest were the ones closed.
        for (i, c) in crowd.iter_mut().enumerate() {
            assert_eq!(
                closed(c, Duration::from_millis(500)).await,
                i < K,
                "connection {i}"
            );
        }
        assert!(acceptor.seats().try_seat().is_none(), "full again");
    }

    #[test]
    fn a_source_gets_its_cap_and_no_more() {
        let a = Admission::new(2);
        let one = a.admit(B);
        let two = a.admit(B);
        assert!(one.is_some() && two.is_some());
        assert!(a.admit(B).is_none());
        assert!(a.admit(A).is_some(), "another source is not affected");
        drop(one);
        assert!(a.admit(B).is_some(), "a closed connection frees its place");
        drop(two);
    }

    #[tokio::test]
    async fn the_oldest_idle_connection_gives_way_and_a_busy_one_never() {
        let a = Admission::new(10);
        let old = Arc::new(a.admit(B).expect("admitted"));
        std::thread::sleep(Duration::from_millis(1));
        let busy = Arc::new(a.admit(A).expect("admitted"));
        std::thread::sleep(Duration::from_millis(1));
        let young = Arc::new(a.admit(B).expect("admitted"));
        let _request = busy.busy();
        assert_eq!(a.evict_idle(1), 1);
        tokio::time::timeout(Duration::from_secs(1), old.evicted())
            .await
            .expect("the oldest idle connection is asked to close");
        assert_eq!(a.evict_idle(1), 1);
        tokio::time::timeout(Duration::from_secs(1), young.evicted())
            .await
            .expect("then the next idle one");
        assert_eq!(a.evict_idle(1), 0, "the busy one stays");
    }

    /// One after another: the idle longest first, never a busy one, never
    /// one already asked.
    #[tokio::test]
    async fn evictions_take_the_oldest_idle_ones_in_turn() {
        let a = Admission::new(100);
        let tickets: Vec<Arc<Ticket>> = (0..10)
            .map(|_| {
                // Idle times in nanoseconds: apart, so their order is sure.
                std::thread::sleep(Duration::from_millis(1));
                Arc::new(a.admit(A).expect("admitted"))
            })
            .collect();
        let _request = tickets[1].busy();
        for i in [0, 2, 3] {
            assert_eq!(a.evict_idle(1), 1);
            tokio::time::timeout(Duration::from_secs(1), tickets[i].evicted())
                .await
                .unwrap_or_else(|_| panic!("connection {i} is among the oldest idle"));
        }
        for i in [1, 4] {
            assert!(
                tokio::time::timeout(Duration::from_millis(20), tickets[i].evicted())
                    .await
                    .is_err(),
                "connection {i} stays"
            );
        }
        for _ in 0..6 {
            assert_eq!(a.evict_idle(1), 1, "the rest but the busy one");
        }
        assert_eq!(a.evict_idle(1), 0);
    }

    /// Idle means silent: a connection that moves bytes through its
    /// stream is younger than one opened after it that sent nothing.
    #[tokio::test]
    async fn a_connection_that_moves_bytes_is_not_the_oldest_idle() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let a = Admission::new(10);
        let talking = Arc::new(a.admit(A).expect("admitted"));
        std::thread::sleep(Duration::from_millis(1));
        let silent = Arc::new(a.admit(B).expect("admitted"));
        std::thread::sleep(Duration::from_millis(1));
        let (mut client, server) = tokio::io::duplex(64);
        let mut s = Deadlines::new(
            server,
            talking.clone(),
            Duration::from_secs(5),
            Duration::from_secs(5),
        );
        client.write_all(b"x").await.expect("write");
        let mut buf = [0u8; 1];
        s.read_exact(&mut buf).await.expect("read");
        assert_eq!(a.evict_idle(1), 1);
        tokio::time::timeout(Duration::from_secs(1), silent.evicted())
            .await
            .expect("the silent one gives way although it opened later");
    }

    #[tokio::test]
    async fn a_connection_idle_again_after_a_request_counts_from_then() {
        let a = Admission::new(10);
        let first = Arc::new(a.admit(A).expect("admitted"));
        std::thread::sleep(Duration::from_millis(1));
        let second = Arc::new(a.admit(B).expect("admitted"));
        std::thread::sleep(Duration::from_millis(1));
        drop(first.busy());
        assert_eq!(a.evict_idle(1), 1);
        tokio::time::timeout(Duration::from_secs(1), second.evicted())
            .await
            .expect("the one idle since it opened gives way first");
        assert_eq!(a.evict_idle(1), 1);
        tokio::time::timeout(Duration::from_secs(1), first.evicted())
            .await
            .expect("then the one whose request ended");
        drop(second);
        assert_eq!(
            a.open_from(B),
            0,
            "a closed connection leaves the accounting"
        );
        assert_eq!(a.open_from(A), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_stream_times_out_and_a_busy_one_does_not() {
        use tokio::io::AsyncReadExt;
        let a = Admission::new(10);
        let ticket = Arc::new(a.admit(A).expect("admitted"));
        let (_client, server) = tokio::io::duplex(64);
        let mut s = Deadlines::new(
            server,
            ticket.clone(),
            Duration::from_secs(1),
            Duration::from_secs(5),
        );
        let mut buf = [0u8; 8];
        let e = s.read(&mut buf).await.expect_err("no first byte");
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);

        // A stream that started: idle while a request is in flight is
        // fine; idle without one is not.
        let (mut client, server) = tokio::io::duplex(64);
        let mut s = Deadlines::new(
            server,
            ticket.clone(),
            Duration::from_secs(1),
            Duration::from_secs(5),
        );
        tokio::io::AsyncWriteExt::write_all(&mut client, b"G")
            .await
            .expect("write");
        assert_eq!(s.read(&mut buf).await.expect("first byte"), 1);
        let request = ticket.busy();
        let waited = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf)).await;
        assert!(waited.is_err(), "closed while a request was in flight");
        drop(request);
        let e = s.read(&mut buf).await.expect_err("idle");
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
    }
}
