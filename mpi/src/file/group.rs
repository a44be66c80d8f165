//! What the files opened on one communicator share: a duplicate of it for their collective
//! calls, and the shared file pointers' counters. Made at the first MPI_File_open on the
//! communicator and kept until the communicator is freed and its last file closed, so that
//! opening a file costs two small collectives, not a new communicator (whose shared memory
//! takes milliseconds to make).
//!
//! The counters lie in one shared-memory segment when every member is on one host (a shared
//! pointer's update is one atomic add), else in the job's key-value store (one round trip to
//! its server). Rank 0 hands out their slots: one per open file.

use crate::abi_gen::*;
use crate::err::MpiErr;
use crate::shwin::Segment;
use crate::state::MpiComm;
use distcomm::comm::Comm;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Shared file pointers one group can have at once.
const SLOTS: usize = 8192;

pub struct IoGroup {
    pub comm: Arc<Comm>,
    counters: Counters,
    /// Rank 0's: the slots no open file uses.
    free: Mutex<Vec<usize>>,
    /// Files open on the group, and whether its communicator is gone: the duplicate goes when
    /// both are done.
    files: AtomicUsize,
    comm_gone: AtomicBool,
    destroyed: AtomicBool,
}

enum Counters {
    Memory(Segment),
    Store { store: Arc<dyn distcomm::rendezvous::Store>, prefix: String },
}

/// Numbers the groups a process makes (the store's keys of a group whose rank 0 is here).
static GROUPS: AtomicU64 = AtomicU64::new(0);

impl IoGroup {
    /// The group of `mc`'s files, made by its first MPI_File_open (collective over `mc`).
    pub fn of(mc: &MpiComm) -> Result<Arc<IoGroup>, MpiErr> {
        if let Some(g) = mc.io.get() {
            return Ok(g.clone());
        }
        let all: Vec<usize> = (0..mc.size()).collect();
        let comm = mc.comm.new_group(&all).map_err(MpiErr::from)?.expect("every rank is a member of its dup");
        let world = comm.world();
        let one_host = comm.members().iter().all(|&m| world.hosts[m as usize] == world.hosts[comm.members()[0] as usize]);
        // One host: a segment (its failure is agreed by every member, so all fall back alike).
        let memory = one_host.then(|| {
            let mut parts = vec![(0i64, 1i64); comm.size()];
            parts[0].0 = (SLOTS * 8) as i64;
            Segment::make(&comm, &parts).ok().map(Counters::Memory)
        });
        let counters = match memory.flatten() {
            Some(c) => c,
            None => {
                // Keys under rank 0's world rank and its own count of groups: unique in the job.
                let n = if comm.rank() == 0 { GROUPS.fetch_add(1, Ordering::Relaxed) as i64 } else { 0 };
                let [n] = super::bcast_i64s(&comm, [n])?;
                Counters::Store { store: world.store.clone(), prefix: format!("mpi/io/{}/{n}", comm.members()[0]) }
            }
        };
        let free = if comm.rank() == 0 { (0..SLOTS).rev().collect() } else { Vec::new() };
        let g = Arc::new(IoGroup { comm, counters, free: Mutex::new(free), files: AtomicUsize::new(0), comm_gone: AtomicBool::new(false), destroyed: AtomicBool::new(false) });
        let _ = mc.io.set(g.clone());
        Ok(g)
    }

    /// Rank 0: a slot for a new file, its counter set to `start`; None when all are taken.
    pub fn take_slot(&self, start: i64) -> Result<Option<usize>, MpiErr> {
        let Some(slot) = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop() else { return Ok(None) };
        self.set(slot, start)?;
        Ok(Some(slot))
    }

    /// Rank 0: gives a closed file's slot back.
    pub fn give_slot(&self, slot: usize) {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).push(slot);
    }

    /// Adds `n` to counter `slot`: its value before.
    pub fn fetch_add(&self, slot: usize, n: i64) -> Result<i64, MpiErr> {
        match &self.counters {
            Counters::Memory(seg) => Ok(self.cell(seg, slot).fetch_add(n, Ordering::AcqRel)),
            Counters::Store { store, prefix } => {
                let now = store.add(&format!("{prefix}/{slot}"), n).map_err(|e| MpiErr::new(MPI_ERR_OTHER, format!("the shared file pointer cannot be updated: {e}")))?;
                Ok(now - n)
            }
        }
    }

    /// Sets counter `slot` to `to` (by one process while no other moves it).
    pub fn set(&self, slot: usize, to: i64) -> Result<(), MpiErr> {
        match &self.counters {
            Counters::Memory(seg) => self.cell(seg, slot).store(to, Ordering::Release),
            Counters::Store { .. } => {
                let now = self.fetch_add(slot, 0)?;
                self.fetch_add(slot, to - now)?;
            }
        }
        Ok(())
    }

    fn cell<'a>(&self, seg: &'a Segment, slot: usize) -> &'a AtomicI64 {
        assert!(slot < SLOTS, "counter slot {slot} out of range");
        // SAFETY: rank 0's part of the segment holds SLOTS aligned i64s, mapped while `seg` lives.
        unsafe { &*((seg.base_of(0) + slot * 8) as *const AtomicI64) }
    }

    pub fn file_opened(&self) {
        self.files.fetch_add(1, Ordering::AcqRel);
    }

    /// A file of the group closed (after its collective close).
    pub fn file_closed(&self) {
        if self.files.fetch_sub(1, Ordering::AcqRel) == 1 && self.comm_gone.load(Ordering::Acquire) {
            self.destroy();
        }
    }

    /// The communicator was freed (or MPI_Finalize): the duplicate goes with its last file.
    pub fn comm_freed(&self) {
        if !self.comm_gone.swap(true, Ordering::AcqRel) && self.files.load(Ordering::Acquire) == 0 {
            self.destroy();
        }
    }

    fn destroy(&self) {
        if !self.destroyed.swap(true, Ordering::AcqRel) {
            self.comm.destroy();
        }
    }
}
