//! MPI_Comm_split_type: splits by the hardware the ranks share.
//!
//! The levels, coarsest first: the host ("mpi_shared_memory"), then the CPU package, the core
//! and the hardware thread ("Package", "Core", "PU", hwloc's names). A rank shares a level's
//! resource with others only if its CPU affinity lies within one such resource (an unbound
//! process shares only its host). Every rank, whatever split type it passes (MPI_UNDEFINED
//! too), makes the same two collectives: an allgather of where each rank sits, then a split.

use crate::abi_gen::*;
use crate::err::{MpiErr, Res};
use crate::state;
use distcomm::buffer::{ConstBuf, MutBuf};
use distcomm::collective::CollArgs;
use std::ffi::{c_char, c_int, CString};
use std::sync::atomic::Ordering;

const LEVELS: [&str; 4] = ["mpi_shared_memory", "Package", "Core", "PU"];
/// A level whose resource this rank's CPUs do not lie within.
const NONE: u64 = u64::MAX;
const KEY: &std::ffi::CStr = c"mpi_hw_resource_type";

fn sysfs_u64(cpu: usize, what: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu{cpu}/topology/{what}")).ok()?.trim().parse().ok()
}

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set for sched_getaffinity to fill.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: set is a cpu_set_t of the size passed.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Vec::new();
    }
    // SAFETY: CPU_ISSET reads the set filled above.
    (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
}

/// Where this rank sits, one id per level: the host's index, then the package, core and CPU
/// ids when every allowed CPU has the same one (NONE from the first level where they differ).
fn my_place(host: u32) -> [u64; 4] {
    let cpus = allowed_cpus();
    let mut place = [host as u64, NONE, NONE, NONE];
    let same = |ids: Vec<Option<u64>>| -> Option<u64> {
        let first = (*ids.first()?)?;
        ids.iter().all(|&x| x == Some(first)).then_some(first)
    };
    let Some(pkg) = same(cpus.iter().map(|&c| sysfs_u64(c, "physical_package_id")).collect()) else { return place };
    place[1] = pkg;
    let Some(core) = same(cpus.iter().map(|&c| sysfs_u64(c, "core_id")).collect()) else { return place };
    place[2] = core;
    if cpus.len() == 1 {
        place[3] = cpus[0] as u64;
    }
    place
}

/// The ranks that share rank `i`'s resource at `level` (None if `i` sits in none there).
fn group_at(all: &[[u64; 4]], i: usize, level: usize) -> Option<Vec<usize>> {
    if all[i][level] == NONE {
        return None;
    }
    Some((0..all.len()).filter(|&j| all[j][..=level] == all[i][..=level]).collect())
}

/// The first level whose resource splits the comm into strict subsets, seen from rank `i`.
fn unguided_level(all: &[[u64; 4]], i: usize) -> Option<usize> {
    (0..LEVELS.len()).find(|&l| group_at(all, i, l).is_some_and(|g| g.len() < all.len()))
}

/// The info's mpi_hw_resource_type, if it has one.
fn requested(info: MPI_Info) -> Result<Option<String>, MpiErr> {
    if info == MPI_INFO_NULL {
        return Ok(None);
    }
    let mut buf = vec![0u8; MPI_MAX_INFO_VAL as usize + 1];
    let (mut len, mut flag) = (buf.len() as c_int, 0);
    // SAFETY: buf holds len bytes; the key is a C string.
    unsafe { crate::info::info_get_string(info, KEY.as_ptr(), &mut len, buf.as_mut_ptr() as *mut c_char, &mut flag) }?;
    if flag == 0 {
        return Ok(None);
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(Some(String::from_utf8_lossy(&buf[..end]).into_owned()))
}

pub unsafe fn comm_split_type(c: MPI_Comm, split_type: c_int, key: c_int, info: MPI_Info, newcomm: *mut MPI_Comm) -> Res {
    state::check_active()?;
    let mc = state::get_comm(c)?;
    let on = |e: MpiErr| e.on(c);
    let o = crate::api::out(newcomm, "newcomm").map_err(on)?;
    if mc.inter.get().is_some() {
        // An intercommunicator splits into intercommunicators: by host for the shared type.
        let color = match split_type {
            MPI_UNDEFINED => MPI_UNDEFINED,
            MPI_COMM_TYPE_SHARED => mc.comm.world().hosts[mc.group_members()[mc.rank()] as usize] as c_int,
            other => {
                let _ = crate::inter::split(&mc, MPI_UNDEFINED, key);
                return Err(MpiErr::new(MPI_ERR_UNSUPPORTED_OPERATION, format!("split_type {other} of an intercommunicator is not supported (MPI_COMM_TYPE_SHARED is)")).on(c));
            }
        };
        *o = crate::inter::split(&mc, color, key)?;
        return Ok(());
    }
    // The arguments are read before the collectives, which every rank makes even if its own
    // arguments are wrong (the others would wait for it otherwise).
    let mut bad = None;
    let want: Option<usize> = match split_type {
        MPI_UNDEFINED | MPI_COMM_TYPE_HW_UNGUIDED => None,
        MPI_COMM_TYPE_SHARED => Some(0),
        MPI_COMM_TYPE_HW_GUIDED | MPI_COMM_TYPE_RESOURCE_GUIDED => match requested(info) {
            // A resource type not known here (or none given) yields MPI_COMM_NULL.
            Ok(r) => r.and_then(|r| LEVELS.iter().position(|l| l.eq_ignore_ascii_case(&r))),
            Err(e) => {
                bad = Some(e);
                None
            }
        },
        other => {
            bad = Some(MpiErr::new(MPI_ERR_ARG, format!("split_type {other} is not a split type")));
            None
        }
    };
    let world = mc.comm.world();
    let me = mc.rank();
    let mine = my_place(world.hosts[mc.comm.members()[me] as usize]);
    let send: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut recv = vec![0u8; send.len() * mc.size()];
    mc.comm
        .collective(CollArgs::Allgather { send: Some(ConstBuf::from_slice(&send)), recv: MutBuf::from_slice(&mut recv), dt: distcomm::DType::Uint64 })
        .map_err(|e| MpiErr::from(e).on(c))?;
    let all: Vec<[u64; 4]> = recv
        .chunks_exact(32)
        .map(|r| std::array::from_fn(|k| u64::from_le_bytes(r[8 * k..8 * k + 8].try_into().expect("8 bytes"))))
        .collect();
    let level = match split_type {
        // The first level that splits the comm into strict subsets, seen from this rank.
        MPI_COMM_TYPE_HW_UNGUIDED => unguided_level(&all, me),
        _ => want,
    };
    let group = level.and_then(|l| group_at(&all, me, l).map(|g| (l, g)));
    // Color: the group's lowest rank and its level (ranks of one group agree on both).
    let color = match (&bad, &group) {
        (None, Some((l, g))) => (g[0] * LEVELS.len() + l) as i32,
        _ => -1,
    };
    let child = mc.comm.split(color, key).map_err(|e| MpiErr::from(e).on(c))?;
    if let Some(e) = bad {
        return Err(e.on(c));
    }
    *o = match child {
        Some(child) => state::add_comm(child, mc.errhandler.load(Ordering::Relaxed)),
        None => MPI_COMM_NULL,
    };
    if let (MPI_COMM_TYPE_HW_UNGUIDED, Some((l, _)), true) = (split_type, &group, info != MPI_INFO_NULL) {
        let v = CString::new(LEVELS[*l]).expect("no NUL");
        // SAFETY: both are C strings.
        unsafe { crate::info::info_set(info, KEY.as_ptr(), v.as_ptr()) }.map_err(on)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unguided_takes_the_first_level_that_is_a_strict_subset() {
        // Two hosts: the host level splits.
        let two_hosts = [[0, 0, 0, 0], [0, 0, 1, 1], [1, 0, 0, 0]];
        assert_eq!(unguided_level(&two_hosts, 0), Some(0));
        assert_eq!(group_at(&two_hosts, 0, 0), Some(vec![0, 1]));
        // One host, ranks bound to cores of one package: the core level splits.
        let bound = [[0, 0, 0, 0], [0, 0, 1, 1], [0, 0, 1, 2]];
        assert_eq!(unguided_level(&bound, 0), Some(2));
        assert_eq!(unguided_level(&bound, 1), Some(2));
        assert_eq!(group_at(&bound, 1, 2), Some(vec![1, 2]));
        // Unbound ranks on one host share nothing finer: no strict subset, MPI_COMM_NULL.
        let unbound = [[0, NONE, NONE, NONE], [0, NONE, NONE, NONE]];
        assert_eq!(unguided_level(&unbound, 0), None);
        // One rank alone: never a strict subset.
        assert_eq!(unguided_level(&[[0, 0, 0, 0]], 0), None);
    }

    #[test]
    fn members_of_one_group_choose_the_same_level() {
        let all = [[0, 0, 0, NONE], [0, 0, 0, NONE], [0, 1, 0, 3], [1, 0, 0, 0]];
        for i in 0..all.len() {
            let l = unguided_level(&all, i).expect("a level");
            for j in group_at(&all, i, l).unwrap() {
                assert_eq!(unguided_level(&all, j), Some(l), "ranks {i} and {j}");
            }
        }
    }
}
