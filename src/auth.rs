//! Mutual, replay-proof authentication of connections from the job token: each side sends a
//! fresh random nonce and proves that it knows the token with an HMAC-SHA-256 over both nonces
//! and a label naming its role (so an exchange cannot be replayed on another connection, nor
//! reflected back at its sender). Both sides verify in constant time before they read anything
//! else. Used by the rendezvous store's handshake (and meant for every connection of the job).

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// Length of nonces and proofs.
pub const LEN: usize = 32;

/// The key every member of a job derives from its token.
#[derive(Clone)]
pub struct Key([u8; LEN]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

impl Key {
    pub fn from_token(token: &[u8]) -> Key {
        Key(sha256(&[b"distcomm job key v2\0", token]))
    }

    /// The key's bytes, for configurations that carry it (never sent anywhere).
    pub fn to_bytes(&self) -> [u8; LEN] {
        self.0
    }

    pub fn from_bytes(b: [u8; LEN]) -> Key {
        Key(b)
    }

    /// Whether both keys come from the same token (constant time).
    pub fn same_as(&self, other: &Key) -> bool {
        ct_eq(&self.0, &other.0)
    }

    /// The proof for `label` over `parts` (each length-prefixed, so no two inputs collide).
    pub fn prove(&self, label: &str, parts: &[&[u8]]) -> [u8; LEN] {
        self.mac(label, parts).finalize().into_bytes().into()
    }

    /// Whether `proof` is the proof for `label` over `parts` (constant time).
    pub fn verify(&self, label: &str, parts: &[&[u8]], proof: &[u8]) -> bool {
        self.mac(label, parts).verify_slice(proof).is_ok()
    }

    fn mac(&self, label: &str, parts: &[&[u8]]) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes any key length");
        m.update(&(label.len() as u64).to_le_bytes());
        m.update(label.as_bytes());
        for p in parts {
            m.update(&(p.len() as u64).to_le_bytes());
            m.update(p);
        }
        m
    }
}

/// Equality in time independent of where the inputs differ (lengths are not secret).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of the concatenation of `parts`.
pub fn sha256(parts: &[&[u8]]) -> [u8; LEN] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

/// A fresh random nonce from the operating system.
pub fn nonce() -> std::io::Result<[u8; LEN]> {
    let mut n = [0u8; LEN];
    getrandom::fill(&mut n).map_err(|e| std::io::Error::other(format!("no random numbers from the OS: {e}")))?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes are the protocol's, not this build's: the job key and a proof for fixed
    /// inputs, as an independent implementation (Python's hashlib and hmac) computes them. Two
    /// ranks built with different toolchains or crate versions agree, or this fails.
    #[test]
    fn keys_and_proofs_are_fixed_by_the_protocol() {
        let k = Key::from_token(b"job-token");
        assert_eq!(hex(&k.to_bytes()), "e906f8c1e9e971a4a0a409492949e71468b9900e6dc363448f579919ef85613b");
        let p = k.prove("data/client", &[&[1, 2], b"abc"]);
        assert_eq!(hex(&p), "6266bfb76140e9b885cc5d1722535137b400db9d675de894571aa1594757e8c7");
    }

    #[test]
    fn proofs_bind_key_label_and_every_part() {
        let k = Key::from_token(b"secret");
        let (a, b) = (nonce().unwrap(), nonce().unwrap());
        assert_ne!(a, b, "fresh nonces");
        let p = k.prove("store/client", &[&a, &b]);
        assert!(k.verify("store/client", &[&a, &b], &p));
        assert!(!k.verify("store/server", &[&a, &b], &p), "another role's label (reflection)");
        assert!(!k.verify("store/client", &[&b, &a], &p), "nonces swapped");
        assert!(!Key::from_token(b"other").verify("store/client", &[&a, &b], &p), "another token");
        assert!(!k.verify("store/client", &[&a, &b], &p[..31]), "a short proof");
        // Length prefixes: moving a byte between parts changes the proof.
        assert_ne!(k.prove("l", &[b"ab", b"c"]), k.prove("l", &[b"a", b"bc"]));
        // Known answer: HMAC-SHA-256 as RFC 4231 defines it (test case 2).
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(b"Jefe").unwrap();
        m.update(b"what do ya want for nothing?");
        let out: [u8; 32] = m.finalize().into_bytes().into();
        assert_eq!(out[..4], [0x5b, 0xdc, 0xc1, 0x46]);
    }
}
