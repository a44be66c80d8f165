//! Encryption of a data connection between hosts (`DC_ENCRYPT=1`): every byte the two ends
//! exchange after the handshake travels in records
//!
//!   `len u32 LE` (of what follows, at most [`RECORD_MAX`] + 16) | AES-256-GCM ciphertext | tag
//!
//! under one key per direction: HMAC-SHA-256 with the job key over the direction's label, the
//! job id, both ranks and both handshake nonces (see `handshake`), so every connection has
//! keys of its own and a record's nonce, the count of records sent before it under that key,
//! never repeats. The receiver counts too: a record dropped, repeated, reordered, cut or
//! altered on the way fails authentication, and the peer is lost; nothing of it is delivered.

use crate::auth::Key;
use crate::error::{Error, Result, Status};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};

/// The most plaintext one record carries (a staging buffer's worth: see `tcp_io`).
pub const RECORD_MAX: usize = 64 * 1024;
const TAG_LEN: usize = 16;
/// Bytes a record adds to what it carries.
pub const OVERHEAD: usize = 4 + TAG_LEN;

const TO_ACCEPTOR: &str = "data/seal/to-acceptor";
const TO_DIALER: &str = "data/seal/to-dialer";

/// Who the two ends of a connection are, as the handshake made them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    pub job_id: u64,
    pub dialer: u32,
    pub acceptor: u32,
    pub dialer_nonce: [u8; crate::auth::LEN],
    pub acceptor_nonce: [u8; crate::auth::LEN],
}

impl Session {
    fn key(&self, key: &Key, label: &str) -> [u8; 32] {
        let (j, d, a) = (self.job_id.to_le_bytes(), self.dialer.to_le_bytes(), self.acceptor.to_le_bytes());
        key.prove(label, &[&j, &d, &a, &self.dialer_nonce, &self.acceptor_nonce])
    }

    /// The two halves for the end that dialled (`dialled`) or accepted.
    pub fn halves(&self, key: &Key, dialled: bool) -> (Sealer, Opener) {
        let (out, inc) = if dialled { (TO_ACCEPTOR, TO_DIALER) } else { (TO_DIALER, TO_ACCEPTOR) };
        (Sealer::new(&self.key(key, out)), Opener::new(&self.key(key, inc)))
    }
}

fn nonce(counter: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_le_bytes());
    // Unique: a counter under a key of this connection alone (see the module's comment).
    Nonce::assume_unique_for_key(n)
}

fn cipher(key: &[u8; 32]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).expect("a 32-byte AES-256 key"))
}

/// The sending half.
pub struct Sealer {
    cipher: LessSafeKey,
    sent: u64,
}

impl Sealer {
    fn new(key: &[u8; 32]) -> Sealer {
        Sealer { cipher: cipher(key), sent: 0 }
    }

    /// Appends to `out` the record of `plain` (at most [`RECORD_MAX`] bytes).
    #[cfg(test)]
    pub fn seal(&mut self, plain: &[u8], out: &mut Vec<u8>) {
        self.seal_appended(out, |rec| rec.extend_from_slice(plain));
    }

    /// Appends to `out` the record of the plaintext `fill` appends to it (at most
    /// [`RECORD_MAX`] bytes): the bytes are written once, where they are then encrypted.
    pub fn seal_appended(&mut self, out: &mut Vec<u8>, fill: impl FnOnce(&mut Vec<u8>)) {
        let head = out.len();
        out.extend_from_slice(&[0; 4]);
        let start = out.len();
        fill(out);
        let n = out.len() - start;
        assert!(n <= RECORD_MAX, "a record of {n} bytes");
        out[head..start].copy_from_slice(&((n + TAG_LEN) as u32).to_le_bytes());
        let tag = self.cipher.seal_in_place_separate_tag(nonce(self.sent), Aad::empty(), &mut out[start..]).expect("AES-GCM seals any record this short");
        out.extend_from_slice(tag.as_ref());
        self.sent += 1;
    }
}

/// The receiving half.
pub struct Opener {
    cipher: LessSafeKey,
    opened: u64,
}

fn broken(what: String) -> Error {
    Error::new(Status::PeerLost, format!("encrypted connection: {what} (tampered with, or corrupted, on the way)"))
}

impl Opener {
    fn new(key: &[u8; 32]) -> Opener {
        Opener { cipher: cipher(key), opened: 0 }
    }

    /// Opens the record at the front of `buf` in place: None while it is not whole yet, else
    /// the bytes it took and where its plaintext lies in `buf`. An error is final.
    pub fn open(&mut self, buf: &mut [u8]) -> Result<Option<(usize, std::ops::Range<usize>)>> {
        let Some(head) = buf.get(..4) else { return Ok(None) };
        let len = u32::from_le_bytes(head.try_into().expect("4 bytes")) as usize;
        if !(TAG_LEN..=RECORD_MAX + TAG_LEN).contains(&len) {
            return Err(broken(format!("a record of {len} bytes")));
        }
        if buf.len() < 4 + len {
            return Ok(None);
        }
        self.cipher
            .open_in_place(nonce(self.opened), Aad::empty(), &mut buf[4..4 + len])
            .map_err(|_| broken(format!("record {} failed authentication", self.opened)))?;
        self.opened += 1;
        Ok(Some((4 + len, 4..4 + len - TAG_LEN)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> ((Sealer, Opener), (Sealer, Opener)) {
        let key = Key::from_token(b"t");
        let s = Session { job_id: 9, dialer: 1, acceptor: 0, dialer_nonce: [1; 32], acceptor_nonce: [2; 32] };
        (s.halves(&key, true), s.halves(&key, false))
    }

    /// The record bytes are the protocol's: the key towards the acceptor and the first record
    /// for fixed inputs, as Python's hmac and the `cryptography` package's AES-GCM make them.
    #[test]
    fn keys_and_records_are_fixed_by_the_protocol() {
        let key = Key::from_token(b"job-token");
        let s = Session { job_id: 9, dialer: 1, acceptor: 0, dialer_nonce: [1; 32], acceptor_nonce: [2; 32] };
        assert_eq!(crate::auth::hex(&s.key(&key, TO_ACCEPTOR)), "6809fc5a6a9539c664d5c2d2cbbdd7478c6b83f542f19e876979a21acb1055d7");
        let (mut sealer, _) = s.halves(&key, true);
        let mut out = Vec::new();
        sealer.seal(b"hello", &mut out);
        assert_eq!(&out[..4], &21u32.to_le_bytes());
        assert_eq!(crate::auth::hex(&out[4..]), "930cad4229d36d08823040c53e96cb82d12296aee0");
    }

    #[test]
    fn records_open_in_order_both_ways() {
        let ((mut ds, mut do_), (mut as_, mut ao)) = pair();
        let mut wire = Vec::new();
        for n in [0, 1, 100, RECORD_MAX] {
            ds.seal(&vec![n as u8; n], &mut wire);
        }
        let mut at = 0;
        for n in [0, 1, 100, RECORD_MAX] {
            let (took, plain) = ao.open(&mut wire[at..]).unwrap().expect("whole");
            assert_eq!(&wire[at..][plain], &vec![n as u8; n][..]);
            at += took;
        }
        assert_eq!(at, wire.len());
        // The other direction has its own key: a record sealed towards the acceptor does not
        // open at the dialer.
        let mut back = Vec::new();
        as_.seal(b"hello", &mut back);
        let (_, plain) = do_.open(&mut back.clone()).unwrap().unwrap();
        assert_eq!(plain, 4..9);
        let mut wrong = Vec::new();
        pair().0 .0.seal(b"hello", &mut wrong);
        assert!(pair().0 .1.open(&mut wrong).is_err(), "a dialer's own record does not open at the dialer");
    }

    #[test]
    fn a_partial_record_waits_and_a_tampered_repeated_or_reordered_one_fails() {
        let ((mut s, _), (_, mut o)) = pair();
        let mut wire = Vec::new();
        s.seal(b"first", &mut wire);
        let one = wire.len();
        s.seal(b"second", &mut wire);
        assert!(o.open(&mut wire[..one - 1]).unwrap().is_none(), "not whole yet");
        // Reordered: the second record first.
        let ((_, _), (_, mut o2)) = pair();
        assert!(o2.open(&mut wire.clone()[one..]).is_err());
        // Tampered: one bit of the ciphertext.
        let mut t = wire.clone();
        t[6] ^= 1;
        let ((_, _), (_, mut o3)) = pair();
        assert!(o3.open(&mut t).is_err());
        // Repeated: the first record twice.
        let mut w = wire.clone();
        assert!(o.open(&mut w).unwrap().is_some());
        let mut again = wire[..one].to_vec();
        assert!(o.open(&mut again).is_err());
        // A length no sender writes.
        let mut bad = vec![0xff, 0xff, 0xff, 0x7f];
        assert!(o.open(&mut bad).unwrap_err().msg.contains("a record of"));
    }
}

#[cfg(test)]
mod speed {
    /// Not a test of speed (no bound): prints this machine's AES-256-GCM rate through ring
    /// (`cargo test --release --lib seal::speed -- --nocapture`; RustCrypto's aes-gcm did a fifth
    /// of it here, hence ring).
    #[test]
    fn prints_the_rate() {
        use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
        let k = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &[7u8; 32]).unwrap());
        let mut buf = vec![7u8; super::RECORD_MAX];
        let n = 2000u64;
        let t0 = std::time::Instant::now();
        for i in 0..n {
            let mut nb = [0u8; 12];
            nb[4..].copy_from_slice(&i.to_le_bytes());
            let tag = k.seal_in_place_separate_tag(Nonce::assume_unique_for_key(nb), Aad::empty(), &mut buf).unwrap();
            let mut withtag = std::mem::take(&mut buf);
            withtag.extend_from_slice(tag.as_ref());
            let plain = k.open_in_place(Nonce::assume_unique_for_key(nb), Aad::empty(), &mut withtag).unwrap().len();
            withtag.truncate(plain);
            buf = withtag;
        }
        let secs = t0.elapsed().as_secs_f64();
        eprintln!("ring AES-256-GCM: sealed and opened {:.2} GB/s (one thread, 64 KiB records)", (n as usize * super::RECORD_MAX) as f64 / secs / 1e9);
    }
}
