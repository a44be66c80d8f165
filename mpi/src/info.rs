//! Info objects (ordered key/value strings) and communicator attributes (user keyvals).

use crate::abi_gen::*;
use crate::err::{MpiErr, Res};
use crate::keyval::{self, Kind};
use crate::mpi_err;
use crate::state;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Mutex;

pub const INFO_BASE: usize = 0x7000_0000;

static INFOS: Mutex<Vec<Option<Vec<(String, String)>>>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn cstr(p: *const c_char, what: &str) -> Result<String, MpiErr> {
    if p.is_null() {
        return mpi_err!(MPI_ERR_ARG, "{what} is NULL");
    }
    // SAFETY: a NUL-terminated string from the caller.
    Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

fn key_of(p: *const c_char) -> Result<String, MpiErr> {
    let k = cstr(p, "key")?;
    if k.is_empty() || k.len() >= MPI_MAX_INFO_KEY as usize {
        return mpi_err!(MPI_ERR_INFO_KEY, "key {k:?} is empty or longer than MPI_MAX_INFO_KEY - 1");
    }
    Ok(k)
}

/// Runs `f` on the entries of an info (MPI_INFO_ENV reads as empty), or MPI_ERR_INFO.
fn with<T>(h: MPI_Info, f: impl FnOnce(&mut Vec<(String, String)>) -> Result<T, MpiErr>) -> Result<T, MpiErr> {
    if h == MPI_INFO_ENV {
        return f(&mut Vec::new());
    }
    let mut v = lock(&INFOS);
    match h.checked_sub(INFO_BASE).and_then(|i| v.get_mut(i)).and_then(|x| x.as_mut()) {
        Some(e) => f(e),
        None if h == MPI_INFO_NULL => mpi_err!(MPI_ERR_INFO, "MPI_INFO_NULL is not an info object"),
        None => mpi_err!(MPI_ERR_INFO, "{h:#x} is not a valid info object (never made, or freed)"),
    }
}

pub(crate) fn add(entries: Vec<(String, String)>) -> MPI_Info {
    let mut v = lock(&INFOS);
    let slot = v.iter().position(|s| s.is_none()).unwrap_or_else(|| {
        v.push(None);
        v.len() - 1
    });
    v[slot] = Some(entries);
    INFO_BASE + slot
}

fn out<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T, MpiErr> {
    // SAFETY: a non-NULL out-pointer from the caller is writable.
    unsafe { p.as_mut() }.ok_or_else(|| MpiErr::new(MPI_ERR_ARG, format!("{what} is NULL")))
}

/// Copies `s` into `buf` of `cap` bytes (NUL-terminated, truncated to fit).
fn put(s: &str, buf: *mut c_char, cap: usize) {
    if buf.is_null() || cap == 0 {
        return;
    }
    let n = s.len().min(cap - 1);
    // SAFETY: the caller's buffer holds `cap` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf as *mut u8, n);
        *buf.add(n) = 0;
    }
}

pub unsafe fn info_create(info: *mut MPI_Info) -> Res {
    *out(info, "info")? = add(Vec::new());
    Ok(())
}

/// A new info object of `pairs`, into `*info`.
pub(crate) fn with_pairs(pairs: &[(&str, String)], info: *mut MPI_Info) -> Res {
    let o = out(info, "info")?;
    let mut h = MPI_INFO_NULL;
    // SAFETY: h is ours to fill; keys and values are NUL-terminated strings of ours.
    unsafe { info_create(&mut h)? };
    for (k, v) in pairs {
        let (k, v) = (std::ffi::CString::new(*k).expect("no NUL"), std::ffi::CString::new(v.as_str()).expect("no NUL"));
        unsafe { info_set(h, k.as_ptr(), v.as_ptr())? };
    }
    *o = h;
    Ok(())
}

pub unsafe fn info_free(info: *mut MPI_Info) -> Res {
    let h = out(info, "info")?;
    with(*h, |_| Ok(()))?;
    if *h == MPI_INFO_ENV {
        return mpi_err!(MPI_ERR_INFO, "MPI_INFO_ENV cannot be freed");
    }
    lock(&INFOS)[*h - INFO_BASE] = None;
    *h = MPI_INFO_NULL;
    Ok(())
}

pub unsafe fn info_dup(info: MPI_Info, newinfo: *mut MPI_Info) -> Res {
    let o = out(newinfo, "newinfo")?;
    let copy = with(info, |e| Ok(e.clone()))?;
    *o = add(copy);
    Ok(())
}

pub unsafe fn info_set(info: MPI_Info, key: *const c_char, value: *const c_char) -> Res {
    let (k, v) = (key_of(key)?, cstr(value, "value")?);
    if v.len() >= MPI_MAX_INFO_VAL as usize {
        return mpi_err!(MPI_ERR_INFO_VALUE, "value longer than MPI_MAX_INFO_VAL - 1");
    }
    if info == MPI_INFO_ENV {
        return mpi_err!(MPI_ERR_INFO, "MPI_INFO_ENV is read-only");
    }
    with(info, |e| {
        match e.iter_mut().find(|(ek, _)| *ek == k) {
            Some(x) => x.1 = v,
            None => e.push((k, v)),
        }
        Ok(())
    })
}

pub unsafe fn info_delete(info: MPI_Info, key: *const c_char) -> Res {
    let k = key_of(key)?;
    with(info, |e| match e.iter().position(|(ek, _)| *ek == k) {
        Some(i) => {
            e.remove(i);
            Ok(())
        }
        None => mpi_err!(MPI_ERR_INFO_NOKEY, "key {k:?} is not set"),
    })
}

fn value_of(info: MPI_Info, key: *const c_char) -> Result<Option<String>, MpiErr> {
    let k = key_of(key)?;
    with(info, |e| Ok(e.iter().find(|(ek, _)| *ek == k).map(|(_, v)| v.clone())))
}

pub unsafe fn info_get(info: MPI_Info, key: *const c_char, valuelen: c_int, value: *mut c_char, flag: *mut c_int) -> Res {
    let f = out(flag, "flag")?;
    match value_of(info, key)? {
        Some(v) => {
            put(&v, value, valuelen.max(0) as usize + 1);
            *f = 1;
        }
        None => *f = 0,
    }
    Ok(())
}

pub unsafe fn info_get_string(info: MPI_Info, key: *const c_char, buflen: *mut c_int, value: *mut c_char, flag: *mut c_int) -> Res {
    let f = out(flag, "flag")?;
    let bl = out(buflen, "buflen")?;
    match value_of(info, key)? {
        Some(v) => {
            if *bl > 0 {
                put(&v, value, *bl as usize);
            }
            *bl = v.len() as c_int + 1;
            *f = 1;
        }
        None => *f = 0,
    }
    Ok(())
}

pub unsafe fn info_get_valuelen(info: MPI_Info, key: *const c_char, valuelen: *mut c_int, flag: *mut c_int) -> Res {
    let f = out(flag, "flag")?;
    let l = out(valuelen, "valuelen")?;
    match value_of(info, key)? {
        Some(v) => {
            *l = v.len() as c_int;
            *f = 1;
        }
        None => *f = 0,
    }
    Ok(())
}

pub unsafe fn info_get_nkeys(info: MPI_Info, nkeys: *mut c_int) -> Res {
    let o = out(nkeys, "nkeys")?;
    *o = with(info, |e| Ok(e.len() as c_int))?;
    Ok(())
}

pub unsafe fn info_get_nthkey(info: MPI_Info, n: c_int, key: *mut c_char) -> Res {
    let k = with(info, |e| match e.get(n.max(0) as usize) {
        Some((k, _)) if n >= 0 => Ok(k.clone()),
        _ => mpi_err!(MPI_ERR_ARG, "n = {n} is not below the number of keys ({})", e.len()),
    })?;
    if key.is_null() {
        return mpi_err!(MPI_ERR_ARG, "key is NULL");
    }
    put(&k, key, MPI_MAX_INFO_KEY as usize);
    Ok(())
}

// ---- communicator attributes: the keyvals of every kind are in keyval.rs -----------------------


pub fn is_user_keyval(k: c_int) -> bool {
    keyval::is_user(Kind::Comm, k)
}

pub unsafe fn comm_create_keyval(copy: Option<MPI_Comm_copy_attr_function>, delete: Option<MPI_Comm_delete_attr_function>, k: *mut c_int, extra: *mut c_void) -> Res {
    let o = out(k, "comm_keyval")?;
    // MPI_COMM_NULL_COPY_FN is NULL (0), MPI_COMM_DUP_FN is 1: kept as addresses.
    *o = keyval::create(Kind::Comm, copy.map_or(0, |f| f as usize), delete.map_or(0, |f| f as usize), extra);
    Ok(())
}

pub unsafe fn comm_free_keyval(k: *mut c_int) -> Res {
    keyval::free(Kind::Comm, out(k, "comm_keyval")?)
}

pub unsafe fn comm_set_attr(c: MPI_Comm, k: c_int, val: *mut c_void) -> Res {
    state::check_active()?;
    let mc = state::get_comm(c)?;
    keyval::set(Kind::Comm, c, &mc.attrs, k, val).map_err(|e| e.on(c))
}

/// A user attribute's value (for MPI_Comm_get_attr).
pub fn get_user_attr(mc: &state::MpiComm, k: c_int) -> Option<usize> {
    keyval::get(Kind::Comm, &mc.attrs, k).ok().flatten()
}

pub unsafe fn comm_delete_attr(c: MPI_Comm, k: c_int) -> Res {
    state::check_active()?;
    let mc = state::get_comm(c)?;
    keyval::delete(Kind::Comm, c, &mc.attrs, k).map_err(|e| e.on(c))
}

/// Runs the delete callbacks of every attribute of a communicator being freed.
pub fn delete_all(mc: &state::MpiComm) {
    let _ = keyval::delete_all(mc.handle, &mc.attrs);
}

/// The attributes a dup gets: each keyval's copy callback decides (MPI_COMM_DUP_FN copies,
/// MPI_COMM_NULL_COPY_FN does not).
pub fn copied_attrs(old: &state::MpiComm) -> Result<Vec<(c_int, usize)>, MpiErr> {
    keyval::copied(old.handle, &old.attrs)
}
