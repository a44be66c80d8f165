//! Groups: ordered lists of world ranks, as integer handles (GROUP_BASE + slot).

use crate::abi_gen::*;
use crate::err::MpiErr;
use std::sync::{Arc, Mutex};

pub const GROUP_BASE: usize = 0x5000_0000;

static GROUPS: Mutex<Vec<Option<Arc<Vec<u32>>>>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The members (world ranks, in group order) behind a handle, or MPI_ERR_GROUP.
pub fn get(h: MPI_Group) -> Result<Arc<Vec<u32>>, MpiErr> {
    if h == MPI_GROUP_EMPTY {
        return Ok(Arc::new(Vec::new()));
    }
    let g = lock(&GROUPS);
    match h.checked_sub(GROUP_BASE).and_then(|i| g.get(i)).cloned().flatten() {
        Some(m) => Ok(m),
        None if h == MPI_GROUP_NULL => crate::mpi_err!(MPI_ERR_GROUP, "MPI_GROUP_NULL is not a group"),
        None => crate::mpi_err!(MPI_ERR_GROUP, "{h:#x} is not a valid group (never made, or freed)"),
    }
}

pub fn add(members: Vec<u32>) -> MPI_Group {
    if members.is_empty() {
        return MPI_GROUP_EMPTY;
    }
    let mut g = lock(&GROUPS);
    let slot = g.iter().position(|s| s.is_none()).unwrap_or_else(|| {
        g.push(None);
        g.len() - 1
    });
    g[slot] = Some(Arc::new(members));
    GROUP_BASE + slot
}

pub fn free(h: MPI_Group) -> Result<(), MpiErr> {
    if h == MPI_GROUP_EMPTY {
        return Ok(());
    }
    get(h)?;
    lock(&GROUPS)[h - GROUP_BASE] = None;
    crate::session::forget_group(h);
    Ok(())
}
