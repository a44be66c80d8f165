//! The records of the file store (`file_store`), each one signed with its job's key.
//!
//! A record is `body_len u32 | fnv1a32(body) u32 | body`, where
//! `body = ns [16] | generation u32 | op u8 | key_len u32 | key | value | mac [32]`, integers
//! little-endian. The checksum finds records cut short by a crash; it proves nothing. `ns` names
//! the job's key (a digest of it), so the records of jobs with other tokens that share the file
//! are skipped unread. `mac` is HMAC-SHA-256 with the job's key over the file's epoch, the
//! record's offset in the file and the body before it: a writer without the token can neither
//! forge a record of the job nor replay one (copied to another offset or into a reset file).

use crate::auth::{self, Key};

pub const OP_SET: u8 = 1;
pub const OP_GEN: u8 = 2;
/// `body_len` and the checksum.
const REC_HEAD: usize = 8;
pub const NS_LEN: usize = 16;
/// `ns`, generation, op, key_len.
const BODY_HEAD: usize = NS_LEN + 9;
const MAC_LEN: usize = auth::LEN;
const LABEL: &str = "file/record";

/// A job's key and its namespace in the file.
pub struct Signer {
    key: Key,
    pub ns: [u8; NS_LEN],
}

impl Signer {
    pub fn from_token(token: &[u8]) -> Signer {
        let key = Key::from_token(token);
        let d = auth::sha256(&[b"distcomm file store namespace v1\0", &key.to_bytes()]);
        Signer { key, ns: d[..NS_LEN].try_into().expect("16 of 32 bytes") }
    }

    fn mac(&self, epoch: u64, offset: u64, signed: &[u8]) -> [u8; MAC_LEN] {
        self.key.prove(LABEL, &[&epoch.to_le_bytes(), &offset.to_le_bytes(), signed])
    }

    /// The record to write at `offset` of the file of `epoch`.
    pub fn encode(&self, epoch: u64, offset: u64, gen: u32, op: u8, key: &str, value: &[u8]) -> Vec<u8> {
        let body_len = BODY_HEAD + key.len() + value.len() + MAC_LEN;
        let mut r = Vec::with_capacity(REC_HEAD + body_len);
        r.extend_from_slice(&(body_len as u32).to_le_bytes());
        r.extend_from_slice(&[0; 4]);
        r.extend_from_slice(&self.ns);
        r.extend_from_slice(&gen.to_le_bytes());
        r.push(op);
        r.extend_from_slice(&(key.len() as u32).to_le_bytes());
        r.extend_from_slice(key.as_bytes());
        r.extend_from_slice(value);
        let mac = self.mac(epoch, offset, &r[REC_HEAD..]);
        r.extend_from_slice(&mac);
        let crc = fnv1a32(&r[REC_HEAD..]);
        r[4..8].copy_from_slice(&crc.to_le_bytes());
        r
    }

    /// Whether `rec`, read at `offset` of the file of `epoch`, is this job's and was signed there.
    pub fn verify(&self, epoch: u64, offset: u64, rec: &Record<'_>) -> bool {
        rec.ns == self.ns && self.key.verify(LABEL, &[&epoch.to_le_bytes(), &offset.to_le_bytes(), rec.signed], rec.mac)
    }
}

pub struct Record<'a> {
    pub ns: &'a [u8],
    pub gen: u32,
    pub op: u8,
    pub key: &'a [u8],
    pub value: &'a [u8],
    /// The body before the mac.
    signed: &'a [u8],
    mac: &'a [u8],
}

/// Decodes the record at the start of `buf` (not its signature: see [`Signer::verify`]):
/// `Some((record, length))`, or `None` when it is cut short or corrupt. Lengths are checked
/// against the store's limits before anything is sliced.
pub fn decode(buf: &[u8], max_key: usize, max_value: usize) -> Option<(Record<'_>, usize)> {
    let body_len = u32::from_le_bytes(buf.get(0..4)?.try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(buf.get(4..8)?.try_into().ok()?);
    if !(BODY_HEAD + MAC_LEN..=BODY_HEAD + max_key + max_value + MAC_LEN).contains(&body_len) {
        return None;
    }
    let body = buf.get(REC_HEAD..REC_HEAD + body_len)?;
    if fnv1a32(body) != crc {
        return None;
    }
    let (signed, mac) = body.split_at(body_len - MAC_LEN);
    let gen = u32::from_le_bytes(signed[NS_LEN..NS_LEN + 4].try_into().unwrap());
    let op = signed[NS_LEN + 4];
    let key_len = u32::from_le_bytes(signed[NS_LEN + 5..BODY_HEAD].try_into().unwrap()) as usize;
    if key_len > signed.len() - BODY_HEAD || (op != OP_SET && op != OP_GEN) {
        return None;
    }
    let key = &signed[BODY_HEAD..BODY_HEAD + key_len];
    let value = &signed[BODY_HEAD + key_len..];
    Some((Record { ns: &signed[..NS_LEN], gen, op, key, value, signed, mac }, REC_HEAD + body_len))
}

fn fnv1a32(data: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in data {
        h ^= b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 1 << 20;

    #[test]
    fn records_round_trip_and_detect_damage() {
        let s = Signer::from_token(b"t");
        let r = s.encode(5, 16, 7, OP_SET, "k", b"value");
        let (rec, len) = decode(&r, MAX, MAX).unwrap();
        assert_eq!((rec.gen, rec.op, rec.key, rec.value, len), (7, OP_SET, &b"k"[..], &b"value"[..], r.len()));
        assert!(s.verify(5, 16, &rec));
        for cut in 0..r.len() {
            assert!(decode(&r[..cut], MAX, MAX).is_none(), "cut at {cut}");
        }
        let mut bad = r.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(decode(&bad, MAX, MAX).is_none());
        let mut huge = r.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&huge, MAX, MAX).is_none());
    }

    #[test]
    fn only_the_job_that_signed_a_record_takes_it_and_only_where_it_was_written() {
        let (a, b) = (Signer::from_token(b"job a"), Signer::from_token(b"job b"));
        assert_ne!(a.ns, b.ns);
        let r = a.encode(5, 16, 1, OP_SET, "k", b"v");
        let (rec, _) = decode(&r, MAX, MAX).unwrap();
        assert!(a.verify(5, 16, &rec));
        assert!(!b.verify(5, 16, &rec), "another token's job");
        assert!(!a.verify(5, 99, &rec), "replayed at another offset");
        assert!(!a.verify(6, 16, &rec), "replayed into a reset file");
        // B's forgery in A's namespace (a valid checksum, B's mac) is not A's either.
        let mut forged = b.encode(5, 16, 1, OP_SET, "k", b"evil");
        forged[8..8 + NS_LEN].copy_from_slice(&a.ns);
        let crc = fnv1a32(&forged[8..]);
        forged[4..8].copy_from_slice(&crc.to_le_bytes());
        let (rec, _) = decode(&forged, MAX, MAX).unwrap();
        assert_eq!(rec.ns, a.ns);
        assert!(!a.verify(5, 16, &rec));
    }
}
