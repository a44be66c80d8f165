//! A file view (MPI_File_set_view): which bytes of the file a process sees. The view's data is
//! the filetype's data blocks tiled from `disp`, one filetype extent apart; offsets and file
//! pointers count etypes of that data. A transfer of `len` data bytes from data byte `pos`
//! becomes the file ranges `for_each_range` gives.

use super::datarep::Datarep;
use crate::abi_gen::*;
use crate::datatype::{resolve, Type};
use crate::err::MpiErr;
use crate::mpi_err;
use crate::typemap::Block;
use std::sync::Arc;

pub struct View {
    pub disp: i64,
    pub etype: (MPI_Datatype, Arc<Type>),
    pub filetype: (MPI_Datatype, Arc<Type>),
    pub datarep: Datarep,
    /// Bytes of one etype.
    pub esize: u64,
    /// The filetype's data blocks, offsets from the tile's start.
    blocks: Vec<Block>,
    /// Data bytes in the tile before each block.
    starts: Vec<u64>,
    /// Data bytes in one tile (the filetype's size).
    tile: u64,
    /// Bytes from one tile to the next (the filetype's extent).
    extent: i64,
}

impl View {
    /// The view a file opens with: its bytes, from the start.
    pub fn bytes() -> View {
        View::new(0, MPI_BYTE, MPI_BYTE, Datarep::Native, true).expect("MPI_BYTE makes a view")
    }

    /// A view of `filetype`s of `etype`s from byte `disp`; on a file opened read-only the types
    /// may overlap themselves.
    pub fn new(disp: i64, etype: MPI_Datatype, filetype: MPI_Datatype, datarep: Datarep, read_only: bool) -> Result<View, MpiErr> {
        if disp < 0 {
            return mpi_err!(MPI_ERR_ARG, "disp {disp} is negative");
        }
        let et = resolve(etype)?;
        let ft = resolve(filetype)?;
        datarep.check(&et, "the etype")?;
        datarep.check(&ft, "the filetype")?;
        let esize = et.map.size;
        if esize == 0 {
            return mpi_err!(MPI_ERR_TYPE, "the etype holds no data");
        }
        let tile = ft.map.size;
        if tile % esize != 0 {
            return mpi_err!(MPI_ERR_TYPE, "the filetype ({tile} bytes) is not made of etypes ({esize} bytes each)");
        }
        let extent = ft.map.extent();
        if tile > 0 && extent <= 0 {
            return mpi_err!(MPI_ERR_TYPE, "the filetype's extent {extent} is not positive");
        }
        check_order(&et, "etype", read_only)?;
        let blocks = check_order(&ft, "filetype", read_only)?;
        let mut starts = Vec::with_capacity(blocks.len());
        let mut before = 0u64;
        for b in &blocks {
            starts.push(before);
            before += b.len;
        }
        Ok(View { disp, etype: (etype, et), filetype: (filetype, ft), datarep, esize, blocks, starts, tile, extent })
    }

    /// Whether consecutive tiles' data abut, so that the view's data is one run of the file.
    fn one_run(&self) -> bool {
        self.blocks.len() == 1 && self.blocks[0].len as i64 == self.extent
    }

    /// The file offset of data byte `pos` (MPI_File_get_byte_offset, with `pos` in bytes).
    pub fn byte_offset(&self, pos: u64) -> Result<i64, MpiErr> {
        let mut at = None;
        self.for_each_range(pos, 1, |off, _| {
            at = Some(off);
            Ok(false)
        })?;
        // At the end of a view without data: where the next tile would start.
        Ok(at.unwrap_or(self.disp))
    }

    /// Calls `f(file offset, bytes)` for the file ranges that hold `len` data bytes from data
    /// byte `pos`, in order, touching ranges merged; stops where `f` returns false.
    pub fn for_each_range(&self, pos: u64, len: u64, mut f: impl FnMut(i64, usize) -> Result<bool, MpiErr>) -> Result<(), MpiErr> {
        if len == 0 {
            return Ok(());
        }
        if self.tile == 0 {
            return mpi_err!(MPI_ERR_ARG, "the view's filetype holds no data, so {len} bytes have nowhere to go");
        }
        let too_far = || MpiErr::new(MPI_ERR_ARG, format!("data at byte {pos} of the view lies beyond the largest file offset"));
        let end_pos = pos.checked_add(len).ok_or_else(too_far)?;
        if self.one_run() {
            let start = i64::try_from(pos).ok().and_then(|p| p.checked_add(self.disp + self.blocks[0].off)).ok_or_else(too_far)?;
            start.checked_add(len as i64).ok_or_else(too_far)?;
            let mut done = 0u64;
            while done < len {
                let n = (len - done).min(1 << 30) as usize;
                if !f(start + done as i64, n)? {
                    break;
                }
                done += n as u64;
            }
            return Ok(());
        }
        let mut pending: Option<(i64, usize)> = None;
        let mut p = pos;
        let mut tile = pos / self.tile;
        let mut i = self.starts.partition_point(|&s| s <= pos % self.tile) - 1;
        while p < end_pos {
            let base = i64::try_from(tile).ok().and_then(|t| t.checked_mul(self.extent)).and_then(|b| b.checked_add(self.disp)).ok_or_else(too_far)?;
            let b = self.blocks[i];
            let skip = p - tile * self.tile - self.starts[i];
            let n = (b.len - skip).min(end_pos - p) as usize;
            let off = base.checked_add(b.off + skip as i64).ok_or_else(too_far)?;
            match pending {
                Some((o, m)) if o + m as i64 == off && m + n <= 1 << 30 => pending = Some((o, m + n)),
                Some((o, m)) => {
                    if !f(o, m)? {
                        return Ok(());
                    }
                    pending = Some((off, n));
                }
                None => pending = Some((off, n)),
            }
            p += n as u64;
            i += 1;
            if i == self.blocks.len() {
                i = 0;
                tile += 1;
            }
        }
        if let Some((o, m)) = pending {
            f(o, m)?;
        }
        Ok(())
    }

    /// Data bytes of the view that lie before file offset `end` (the end of the file, for
    /// MPI_SEEK_END).
    pub fn data_before(&self, end: i64) -> u64 {
        if end <= self.disp || self.tile == 0 {
            return 0;
        }
        let rel = end - self.disp;
        if self.one_run() {
            return (rel - self.blocks[0].off).max(0) as u64;
        }
        let tiles = rel / self.extent;
        let rest = rel - tiles * self.extent;
        let part: u64 = self.blocks.iter().map(|b| (rest - b.off).clamp(0, b.len as i64) as u64).sum();
        (tiles as u64).saturating_mul(self.tile).saturating_add(part)
    }
}

/// The data blocks of a view's type, which the standard wants at non-negative, non-decreasing
/// displacements and, unless the file is only read, not overlapping (else MPI_ERR_IO, as
/// MPICH answers).
fn check_order(t: &Type, what: &str, read_only: bool) -> Result<Vec<Block>, MpiErr> {
    let blocks: Vec<Block> = t.map.flat_blocks().into_iter().filter(|b| b.len > 0).collect();
    let (mut last, mut end) = (0i64, 0i64);
    for b in &blocks {
        if b.off < 0 {
            return mpi_err!(MPI_ERR_IO, "the {what} has data at displacement {}: a view's types need non-negative displacements", b.off);
        }
        if b.off < last {
            return mpi_err!(MPI_ERR_IO, "the {what}'s displacements decrease (a block at {} after one at {last}): a view's types need non-decreasing ones", b.off);
        }
        if b.off < end && !read_only {
            return mpi_err!(MPI_ERR_IO, "the {what}'s blocks overlap (at byte {}), which a view allows only on a file opened MPI_MODE_RDONLY", b.off);
        }
        last = b.off;
        end = end.max(b.off + b.len as i64);
    }
    Ok(blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(v: &View, pos: u64, len: u64) -> Vec<(i64, usize)> {
        let mut out = vec![];
        v.for_each_range(pos, len, |o, n| {
            out.push((o, n));
            Ok(true)
        })
        .unwrap();
        out
    }

    #[test]
    fn a_byte_view_is_one_range() {
        let v = View::bytes();
        assert_eq!(ranges(&v, 5, 100), vec![(5, 100)]);
        assert_eq!(v.byte_offset(7).unwrap(), 7);
        assert_eq!(v.data_before(42), 42);
    }

    #[test]
    fn a_strided_filetype_tiles_its_blocks() {
        // Two ints of every four from byte 8: blocks (0, 8) in tiles of 16 bytes.
        let ft = crate::datatype::vector(1, 2, 4, MPI_INT, false, false).unwrap();
        let ft = crate::datatype::resized(ft, 0, 16, false).unwrap();
        crate::datatype::commit(ft).unwrap();
        let v = View::new(8, MPI_INT, ft, Datarep::Native, false).unwrap();
        assert_eq!(ranges(&v, 0, 8), vec![(8, 8)]);
        assert_eq!(ranges(&v, 4, 12), vec![(12, 4), (24, 8)]);
        assert_eq!(ranges(&v, 8, 20), vec![(24, 8), (40, 8), (56, 4)]);
        assert_eq!(v.byte_offset(9).unwrap(), 25);
        // File of 30 bytes: tile 0 whole (8), tile 1 from byte 24 to 30 (6).
        assert_eq!(v.data_before(30), 14);
        assert_eq!(v.data_before(8), 0);
    }

    #[test]
    fn filetypes_must_be_made_of_etypes_and_go_forward() {
        let ft = crate::datatype::contiguous(3, MPI_BYTE).unwrap();
        crate::datatype::commit(ft).unwrap();
        assert_eq!(View::new(0, MPI_INT, ft, Datarep::Native, false).err().unwrap().class, MPI_ERR_TYPE);
        let back = crate::datatype::indexed_block(1, &[2, 0], MPI_INT, false, false).unwrap();
        crate::datatype::commit(back).unwrap();
        assert_eq!(View::new(0, MPI_INT, back, Datarep::Native, true).err().unwrap().class, MPI_ERR_IO);
        let overlap = crate::datatype::indexed(&[3, 1], &[0, 1], MPI_INT, false, false).unwrap();
        crate::datatype::commit(overlap).unwrap();
        assert_eq!(View::new(0, MPI_INT, overlap, Datarep::Native, false).err().unwrap().class, MPI_ERR_IO);
        assert!(View::new(0, MPI_INT, overlap, Datarep::Native, true).is_ok());
        assert_eq!(View::new(-1, MPI_INT, MPI_INT, Datarep::Native, false).err().unwrap().class, MPI_ERR_ARG);
        assert_eq!(Datarep::parse("big-endian").err().unwrap().class, MPI_ERR_UNSUPPORTED_DATAREP);
        assert_eq!(View::new(0, MPI_LONG, MPI_LONG, Datarep::External32, false).err().unwrap().class, MPI_ERR_UNSUPPORTED_DATAREP);
    }
}
