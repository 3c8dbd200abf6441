//! The trace's words: one sentence per step, in English and Portuguese
//! side by side ([`SENTENCES`]), with `{name}` holes that [`text`] fills
//! with the event's values. A new event is a variant of [`Event`], its
//! rows here (one per way it is told) and its holes in [`holes`].
//!
//! # Threads
//!
//! Pure functions of an event: any thread, no state.
//!
//! # Corresponds to the C article
//!
//! No C counterpart: the article tells these steps in its prose.

use std::fmt::{self, Display};
use std::time::Duration;

use super::{Event, Lang, Side};
use crate::units::format_duration;

/// Which sentence tells an event (an event may have several, chosen by
/// its values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Says {
    Accepted,
    RateAllowed,
    RateRefused,
    Denied,
    TooManyConnections,
    PickedRoundRobin,
    Picked,
    NoBackend,
    Sni,
    SniNobody,
    QueuedFirst,
    Queued,
    TakenNew,
    TakenReused,
    ConnectFailed,
    FailOver,
    TlsHandshake,
    Connected,
    Unreachable,
    FirstBytes,
    Flow,
    HalfClose,
    LastHalfClose,
    Promoted,
    Closed,
    ClosedUnshut,
    ClosedByError,
    Waiting,
}

/// Every sentence, in English then Portuguese.
const SENTENCES: &[(Says, &str, &str)] = &[
    (
        Says::Accepted,
        "accepted client {peer}: accept() gave its socket, fd {fd}",
        "cliente {peer} aceito: o accept() devolveu o socket dele, fd {fd}",
    ),
    (
        Says::RateAllowed,
        "rate limit: {ip} allowed, {used} of {limit} connections in this {window} window",
        "rate limit: {ip} liberado, {used} de {limit} conexões nesta janela de {window}",
    ),
    (
        Says::RateRefused,
        "rate limit: {ip} refused, it already used its {limit} connections of this {window} \
         window; closed without a backend (may retry in {retry})",
        "rate limit: {ip} recusado, já usou as {limit} conexões desta janela de {window}; \
         fechado sem backend (pode tentar de novo em {retry})",
    ),
    (
        Says::Denied,
        "allow/deny: {ip} may not connect here; closed without a backend",
        "allow/deny: {ip} não pode conectar aqui; fechado sem backend",
    ),
    (
        Says::TooManyConnections,
        "max_connections_per_client: {ip} already has its most connections open; \
         closed without a backend",
        "max_connections_per_client: {ip} já tem o máximo de conexões abertas; \
         fechado sem backend",
    ),
    (
        Says::PickedRoundRobin,
        "round robin chose server_idx {server_idx}: backend {backend}{service}",
        "o round robin escolheu server_idx {server_idx}: backend {backend}{service}",
    ),
    (
        Says::Picked,
        "{algorithm} chose server_idx {server_idx}: backend {backend}{service}",
        "{algorithm} escolheu server_idx {server_idx}: backend {backend}{service}",
    ),
    (
        Says::Sni,
        "SNI: the ClientHello asks for {name}: service {service}",
        "SNI: o ClientHello pede {name}: serviço {service}",
    ),
    (
        Says::SniNobody,
        "SNI: the ClientHello asks for {name}: no service takes it, client closed",
        "SNI: o ClientHello pede {name}: nenhum serviço o aceita, cliente fechado",
    ),
    (
        Says::NoBackend,
        "no backend is available (all down or draining): client closed",
        "nenhum backend disponível (todos fora ou em drenagem): cliente fechado",
    ),
    (
        Says::QueuedFirst,
        "pushed (server_idx, client) into the queue, nobody ahead of it",
        "(server_idx, cliente) entrou na fila, ninguém na frente",
    ),
    (
        Says::Queued,
        "pushed (server_idx, client) into the queue, behind {ahead} waiting",
        "(server_idx, cliente) entrou na fila, atrás de {ahead} esperando",
    ),
    (
        Says::TakenNew,
        "taken by worker {worker} (a new thread, its first client) after {waited} in the queue",
        "o worker {worker} pegou o cliente (thread nova, primeiro cliente dela) \
         depois de {waited} na fila",
    ),
    (
        Says::TakenReused,
        "taken by worker {worker} (a reused thread) after {waited} in the queue",
        "o worker {worker} pegou o cliente (thread reaproveitada) depois de {waited} na fila",
    ),
    (
        Says::ConnectFailed,
        "connect to backend {backend} failed: {reason} ({failures} in a row)",
        "connect no backend {backend} falhou: {reason} ({failures} seguida(s))",
    ),
    (
        Says::TlsHandshake,
        "TLS handshake done: {version}, server name {sni}",
        "handshake TLS feito: {version}, nome do servidor {sni}",
    ),
    (
        Says::FailOver,
        "fail-over: trying the next backend, {backend}",
        "fail-over: tentando o próximo backend, {backend}",
    ),
    (
        Says::Connected,
        "connected to backend {backend} in {took}: its socket is fd {fd}",
        "conectado ao backend {backend} em {took}: o socket dele é o fd {fd}",
    ),
    (
        Says::Unreachable,
        "no backend could be reached: client closed",
        "nenhum backend respondeu: cliente fechado",
    ),
    (
        Says::FirstBytes,
        "{arrow}: first {bytes} bytes passed",
        "{arrow}: passaram os primeiros {bytes} bytes",
    ),
    (
        Says::Flow,
        "{arrow}: {bytes} more bytes in {rounds} turn(s) of the pump, {total} so far",
        "{arrow}: mais {bytes} bytes em {rounds} volta(s) do pump, {total} até agora",
    ),
    (
        Says::HalfClose,
        "the {end} finished sending (read returned 0): half-close passed on, \
         shutdown(SHUT_WR) toward the {other}",
        "o {end} terminou de enviar (read devolveu 0): half-close repassado, \
         shutdown(SHUT_WR) no socket do {other}",
    ),
    (
        Says::LastHalfClose,
        "the {end} finished sending (read returned 0): the other way was over \
         already, so the close() that follows passes it on to the {other}",
        "o {end} terminou de enviar (read devolveu 0): o outro sentido já tinha \
         acabado, então o close() que vem a seguir repassa isso ao {other}",
    ),
    (
        Says::Promoted,
        "moved to the kernel relay after {exchanges} exchanges: the kernel moves \
         the bytes now, the worker waits for the end",
        "passou para o relay do kernel depois de {exchanges} trocas: o kernel move \
         os bytes agora, o worker espera o fim",
    ),
    (
        Says::Closed,
        "shutdown(SHUT_RDWR) then close() on both sockets: {to_backend} bytes \
         went to the backend, {to_client} bytes to the client, in {took}",
        "shutdown(SHUT_RDWR) e depois close() nos dois sockets: {to_backend} bytes \
         foram para o backend, {to_client} bytes para o cliente, em {took}",
    ),
    (
        Says::ClosedUnshut,
        "close() on both sockets, each read to its end (no shutdown(SHUT_RDWR) \
         left to do): {to_backend} bytes went to the backend, {to_client} bytes \
         to the client, in {took}",
        "close() nos dois sockets, cada um lido até o fim (nenhum \
         shutdown(SHUT_RDWR) a fazer): {to_backend} bytes foram para o backend, \
         {to_client} bytes para o cliente, em {took}",
    ),
    (
        Says::ClosedByError,
        "shutdown(SHUT_RDWR) then close() on both sockets: {to_backend} bytes \
         went to the backend, {to_client} bytes to the client, in {took}, \
         ended by an error: {error}",
        "shutdown(SHUT_RDWR) e depois close() nos dois sockets: {to_backend} bytes \
         foram para o backend, {to_client} bytes para o cliente, em {took}, \
         encerrada por um erro: {error}",
    ),
    (
        Says::Waiting,
        "worker {worker} goes back to waiting on the queue ({served} client(s) served)",
        "o worker {worker} volta a esperar na fila ({served} cliente(s) atendido(s))",
    ),
];

/// A hole's name and its value.
type Hole = (&'static str, String);

/// The words of `event` in `lang`: its sentence with the holes filled.
pub fn text(lang: Lang, event: &Event<'_>) -> String {
    let (says, holes) = holes(lang, event);
    let sentence =
        SENTENCES
            .iter()
            .find(|(s, _, _)| *s == says)
            .map_or("", |(_, en, pt)| match lang {
                Lang::En => en,
                Lang::Pt => pt,
            });
    fill(sentence, &holes)
}

/// Which sentence tells `event`, and the values of its holes: the steps
/// of the accept thread and the taking, here; a worker's, in
/// [`worker_holes`].
fn holes(lang: Lang, event: &Event<'_>) -> (Says, Vec<Hole>) {
    let d = |d: Duration| Dur(d, lang).to_string();
    let s = |v: &dyn Display| v.to_string();
    match *event {
        Event::Accepted { peer, fd } => (Says::Accepted, vec![("peer", s(&peer)), ("fd", s(&fd))]),
        Event::RateAllowed {
            ip,
            used,
            limit,
            window,
        } => (
            Says::RateAllowed,
            vec![
                ("ip", s(&ip)),
                ("used", s(&used)),
                ("limit", s(&limit)),
                ("window", format_duration(window)),
            ],
        ),
        Event::RateRefused {
            ip,
            limit,
            window,
            retry_after,
        } => (
            Says::RateRefused,
            vec![
                ("ip", s(&ip)),
                ("limit", s(&limit)),
                ("window", format_duration(window)),
                ("retry", d(retry_after)),
            ],
        ),
        Event::Picked {
            algorithm,
            server_idx,
            backend,
            service,
        } => (
            if algorithm == "round-robin" {
                Says::PickedRoundRobin
            } else {
                Says::Picked
            },
            vec![
                ("algorithm", s(&algorithm)),
                ("server_idx", s(&server_idx)),
                ("backend", s(&backend)),
                (
                    "service",
                    service.map_or_else(String::new, |name| match lang {
                        Lang::En => format!(" (service {name})"),
                        Lang::Pt => format!(" (serviço {name})"),
                    }),
                ),
            ],
        ),
        Event::NoBackend => (Says::NoBackend, vec![]),
        Event::Denied { ip } => (Says::Denied, vec![("ip", s(&ip))]),
        Event::TooManyConnections { ip } => (Says::TooManyConnections, vec![("ip", s(&ip))]),
        Event::Queued { ahead: 0 } => (Says::QueuedFirst, vec![]),
        Event::Queued { ahead } => (Says::Queued, vec![("ahead", s(&ahead))]),
        Event::Taken {
            worker,
            first,
            waited,
        } => (
            if first {
                Says::TakenNew
            } else {
                Says::TakenReused
            },
            vec![("worker", s(&worker)), ("waited", d(waited))],
        ),
        _ => worker_holes(lang, event),
    }
}

/// [`holes`] of the steps a worker tells.
fn worker_holes(lang: Lang, event: &Event<'_>) -> (Says, Vec<Hole>) {
    let d = |d: Duration| Dur(d, lang).to_string();
    let s = |v: &dyn Display| v.to_string();
    match *event {
        Event::ConnectFailed {
            backend,
            reason,
            failures,
        } => (
            Says::ConnectFailed,
            vec![
                ("backend", s(&backend)),
                ("reason", s(reason)),
                ("failures", s(&failures)),
            ],
        ),
        Event::FailOver { backend } => (Says::FailOver, vec![("backend", s(&backend))]),
        Event::TlsHandshake { version, sni } => (
            Says::TlsHandshake,
            vec![("version", s(&version)), ("sni", s(&sni.unwrap_or("-")))],
        ),
        Event::Connected { backend, fd, took } => (
            Says::Connected,
            vec![("backend", s(&backend)), ("fd", s(&fd)), ("took", d(took))],
        ),
        Event::Unreachable => (Says::Unreachable, vec![]),
        Event::FirstBytes { from, bytes } => (
            Says::FirstBytes,
            vec![("arrow", s(&Arrow(from, lang))), ("bytes", s(&bytes))],
        ),
        Event::Flow {
            from,
            bytes,
            rounds,
            total,
        } => (
            Says::Flow,
            vec![
                ("arrow", s(&Arrow(from, lang))),
                ("bytes", s(&bytes)),
                ("rounds", s(&rounds)),
                ("total", s(&total)),
            ],
        ),
        Event::HalfClose { from, last } => {
            let (end, other) = ends(from);
            (
                if last {
                    Says::LastHalfClose
                } else {
                    Says::HalfClose
                },
                vec![("end", s(&end.word(lang))), ("other", s(&other.word(lang)))],
            )
        }
        Event::Promoted { exchanges } => (Says::Promoted, vec![("exchanges", s(&exchanges))]),
        Event::Closed {
            to_backend,
            to_client,
            took,
            error,
            unshut,
        } => closed_holes(lang, [to_backend, to_client], took, error, unshut),
        Event::Sni { name, why, service } => sni_holes(lang, name, why, service),
        Event::Waiting { worker, served } => (
            Says::Waiting,
            vec![("worker", s(&worker)), ("served", s(&served))],
        ),
        // The accept thread's steps and the taking: told by `holes`.
        Event::Accepted { .. }
        | Event::RateAllowed { .. }
        | Event::RateRefused { .. }
        | Event::Picked { .. }
        | Event::NoBackend
        | Event::Denied { .. }
        | Event::TooManyConnections { .. }
        | Event::Queued { .. }
        | Event::Taken { .. } => holes(lang, event),
    }
}

/// [`holes`] of the close: bytes each way (to the backend, to the client),
/// the time, and the error that ended it, if any.
fn closed_holes(
    lang: Lang,
    [to_backend, to_client]: [u64; 2],
    took: Duration,
    error: Option<&std::io::Error>,
    unshut: bool,
) -> (Says, Vec<Hole>) {
    let mut holes = vec![
        ("to_backend", to_backend.to_string()),
        ("to_client", to_client.to_string()),
        ("took", Dur(took, lang).to_string()),
    ];
    match error {
        None if unshut => (Says::ClosedUnshut, holes),
        None => (Says::Closed, holes),
        Some(e) => {
            holes.push(("error", e.to_string()));
            (Says::ClosedByError, holes)
        }
    }
}

/// The SNI routing's sentence and holes: the name asked for (or why
/// there is none) and the service chosen, if any.
fn sni_holes(
    lang: Lang,
    name: Option<&str>,
    why: &str,
    service: Option<&str>,
) -> (Says, Vec<Hole>) {
    let name = match (name, lang) {
        (Some(n), _) => n.to_string(),
        (None, Lang::En) => format!("no name ({why})"),
        (None, Lang::Pt) => format!("nenhum nome ({why})"),
    };
    match service {
        Some(svc) => (
            Says::Sni,
            vec![("name", name), ("service", svc.to_string())],
        ),
        None => (Says::SniNobody, vec![("name", name)]),
    }
}

/// `sentence` with each `{name}` replaced by the value of that hole. The
/// values are not scanned: a brace in a backend's name stays as it is.
fn fill(sentence: &str, holes: &[Hole]) -> String {
    let mut out = String::with_capacity(sentence.len() + 32);
    let mut rest = sentence;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find('}') {
            Some(close) => {
                let name = &after[..close];
                match holes.iter().find(|(n, _)| *n == name) {
                    Some((_, value)) => out.push_str(value),
                    None => out.push_str(&rest[open..open + close + 2]),
                }
                rest = &after[close + 1..];
            }
            None => {
                out.push_str(&rest[open..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// The side that sent, and the other.
fn ends(from: Side) -> (Name, Name) {
    match from {
        Side::Client => (Name::Client, Name::Backend),
        Side::Backend => (Name::Backend, Name::Client),
    }
}

/// The two ends, as words.
#[derive(Clone, Copy)]
enum Name {
    Client,
    Backend,
}

impl Name {
    fn word(self, lang: Lang) -> &'static str {
        match (self, lang) {
            (Name::Client, Lang::En) => "client",
            (Name::Client, Lang::Pt) => "cliente",
            (Name::Backend, _) => "backend",
        }
    }
}

/// `client → backend` or `backend → client`, in the trace's language.
struct Arrow(Side, Lang);

impl Display for Arrow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (from, to) = ends(self.0);
        write!(f, "{} → {}", from.word(self.1), to.word(self.1))
    }
}

/// A duration as a reader wants it: `42 µs`, `1.3 ms`, `2.05 s` (with a
/// decimal comma in Portuguese).
pub(super) struct Dur(pub(super) Duration, pub(super) Lang);

impl Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let us = self.0.as_micros();
        let text = if us < 1000 {
            format!("{us} µs")
        } else if us < 1_000_000 {
            format!("{:.1} ms", us as f64 / 1000.0)
        } else {
            format!("{:.2} s", us as f64 / 1_000_000.0)
        };
        match self.1 {
            Lang::En => f.write_str(&text),
            Lang::Pt => f.write_str(&text.replace('.', ",")),
        }
    }
}
