//! ULFM's failure acknowledgement (`MPIX_Comm_failure_ack`, `MPIX_Comm_failure_get_acked`), as
//! MPICH and Open MPI name it: a receive from `MPI_ANY_SOURCE` fails with
//! `MPIX_ERR_PROC_FAILED` while a member of its communicator is lost and not acknowledged (the
//! lost rank could have been its sender); once acknowledged, such receives go on with the
//! others. Receives from the lost rank itself, and collectives, still fail.

use crate::abi_gen::*;
use crate::api::{comm, out};
use crate::err::Res;

pub unsafe fn x_comm_failure_ack(c: MPI_Comm) -> Res {
    comm(c)?.comm.ack_failures();
    Ok(())
}

pub unsafe fn x_comm_failure_get_acked(c: MPI_Comm, failed: *mut MPI_Group) -> Res {
    let mc = comm(c)?;
    let members = mc.comm.members();
    let acked = mc.comm.acked_failures().into_iter().map(|r| members[r]).collect();
    *out(failed, "failedgrp").map_err(|e| e.on(c))? = crate::group::add(acked);
    Ok(())
}
