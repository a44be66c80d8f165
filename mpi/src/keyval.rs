//! Attribute keyvals of communicators, datatypes and windows: one table of keyvals, each made
//! for one kind of object with its copy and delete callbacks and extra state; an object keeps
//! its attributes as a list of (keyval, value) (`Attrs`).
//!
//! Callbacks never run with a lock held: a delete callback may free another object (mpi4py's
//! tests free a window from one), which comes back here.
//!
//! A keyval freed while attributes still use it stays usable until the last of them is
//! deleted (MPI: "the actual free does not transpire until after all references ... have been
//! freed"); freeing it again meanwhile is no error (as in MPICH: MPICH's `attr` tests free a
//! keyval from its own delete callback and then again).

use crate::abi_gen::*;
use crate::err::{MpiErr, Res};
use std::ffi::{c_int, c_void};
use std::sync::Mutex;

/// An object's attributes: (keyval, value), in the order they were set.
pub type Attrs = Mutex<Vec<(c_int, usize)>>;

/// User keyvals start above the predefined attribute keys (comm 0.., window 601..).
const KEYVAL_BASE: c_int = 1000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Comm,
    Type,
    Win,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Comm => "communicator",
            Kind::Type => "datatype",
            Kind::Win => "window",
        }
    }
}

/// The callbacks of every kind have the same C shape (the object is a pointer-sized handle).
type CopyFn = MPI_Comm_copy_attr_function;
type DeleteFn = MPI_Comm_delete_attr_function;

#[derive(Clone, Copy)]
struct Keyval {
    kind: Kind,
    /// 0 = the NULL_COPY_FN (not copied), 1 = the DUP_FN (value copied), else a function.
    copy: usize,
    /// 0 = the NULL_DELETE_FN, else a function.
    delete: usize,
    extra: usize,
    /// False once freed: no longer usable, but attributes still set keep their callbacks.
    live: bool,
    /// Attributes set with it on objects not freed yet.
    attached: usize,
}

impl Keyval {
    /// Live, or freed while attributes still use it.
    fn usable(&self) -> bool {
        self.live || self.attached > 0
    }
}

static KEYVALS: Mutex<Vec<Keyval>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where keyval `k` is in `KEYVALS` (if it is a user keyval's number at all).
fn index(k: c_int) -> Option<usize> {
    k.checked_sub(KEYVAL_BASE).and_then(|i| usize::try_from(i).ok())
}

fn entry(k: c_int) -> Option<Keyval> {
    let v = lock(&KEYVALS);
    index(k).and_then(|i| v.get(i).copied())
}

/// The usable keyval `k` of `kind`, or MPI_ERR_KEYVAL.
fn live(kind: Kind, k: c_int) -> Result<Keyval, MpiErr> {
    match entry(k) {
        Some(kv) if kv.usable() && kv.kind == kind => Ok(kv),
        Some(kv) if kv.usable() => crate::mpi_err!(MPI_ERR_KEYVAL, "keyval {k} is a {} keyval, not a {} one", kv.kind.name(), kind.name()),
        _ => crate::mpi_err!(MPI_ERR_KEYVAL, "keyval {k} is not a valid {} keyval (never made, or freed)", kind.name()),
    }
}

/// `n` more (or fewer) attributes use keyval `k`.
fn attach(k: c_int, n: isize) {
    let mut v = lock(&KEYVALS);
    if let Some(kv) = index(k).and_then(|i| v.get_mut(i)) {
        kv.attached = kv.attached.saturating_add_signed(n);
    }
}

/// The attributes in `list` now belong to a new object (a duplicate's, see `copied`).
pub fn attached(list: &[(c_int, usize)]) {
    for &(k, _) in list {
        attach(k, 1);
    }
}

pub fn is_user(kind: Kind, k: c_int) -> bool {
    live(kind, k).is_ok()
}

pub fn create(kind: Kind, copy: usize, delete: usize, extra: *mut c_void) -> c_int {
    let mut v = lock(&KEYVALS);
    v.push(Keyval { kind, copy, delete, extra: extra as usize, live: true, attached: 0 });
    KEYVAL_BASE + v.len() as c_int - 1
}

/// MPI_*_free_keyval: sets `*k` to MPI_KEYVAL_INVALID (see the module comment for a keyval
/// that attributes still use).
pub fn free(kind: Kind, k: &mut c_int) -> Res {
    live(kind, *k)?;
    lock(&KEYVALS)[(*k - KEYVAL_BASE) as usize].live = false;
    *k = MPI_KEYVAL_INVALID;
    Ok(())
}

fn call_delete(kv: &Keyval, obj: usize, k: c_int, val: usize) -> Res {
    if kv.delete != 0 {
        // SAFETY: the user's delete function, as the standard specifies it.
        let f: DeleteFn = unsafe { std::mem::transmute::<usize, DeleteFn>(kv.delete) };
        let rc = unsafe { f(obj, k, val as *mut c_void, kv.extra as *mut c_void) };
        if rc != MPI_SUCCESS {
            return crate::mpi_err!(MPI_ERR_OTHER, "the delete callback of keyval {k} returned {rc}");
        }
    }
    Ok(())
}

/// MPI_*_set_attr: a value replacing another has the old one's delete callback run first; if
/// that fails, the old value stays and the call fails (as MPICH's `attrerr*` tests expect).
pub fn set(kind: Kind, obj: usize, attrs: &Attrs, k: c_int, val: *mut c_void) -> Res {
    let kv = live(kind, k)?;
    let old = lock(attrs).iter().find(|(ak, _)| *ak == k).map(|x| x.1);
    if let Some(o) = old {
        call_delete(&kv, obj, k, o)?;
    }
    let mut a = lock(attrs);
    match a.iter_mut().find(|(ak, _)| *ak == k) {
        Some(x) => x.1 = val as usize,
        None => {
            a.push((k, val as usize));
            attach(k, 1);
        }
    }
    Ok(())
}

/// MPI_*_get_attr of a user keyval: Ok(None) when the object has no value for it.
pub fn get(kind: Kind, attrs: &Attrs, k: c_int) -> Result<Option<usize>, MpiErr> {
    live(kind, k)?;
    Ok(lock(attrs).iter().find(|(ak, _)| *ak == k).map(|x| x.1))
}

/// Writes a user attribute into MPI_*_get_attr's (attribute_val, flag).
pub fn get_into(kind: Kind, attrs: &Attrs, k: c_int, value: *mut c_void, flag: &mut c_int) -> Res {
    match get(kind, attrs, k)? {
        Some(v) => {
            let o = crate::api::out(value as *mut usize, "attribute_val")?;
            *o = v;
            *flag = 1;
        }
        None => *flag = 0,
    }
    Ok(())
}

/// MPI_*_delete_attr: the attribute goes only if its delete callback succeeds.
pub fn delete(kind: Kind, obj: usize, attrs: &Attrs, k: c_int) -> Res {
    let kv = live(kind, k)?;
    let Some(v) = lock(attrs).iter().find(|(ak, _)| *ak == k).map(|x| x.1) else {
        return crate::mpi_err!(MPI_ERR_KEYVAL, "keyval {k} has no value on this {}", kind.name());
    };
    call_delete(&kv, obj, k, v)?;
    let mut a = lock(attrs);
    if let Some(i) = a.iter().position(|(ak, _)| *ak == k) {
        a.remove(i);
        attach(k, -1);
    }
    Ok(())
}

/// Runs the delete callbacks of every attribute of an object being freed (freed keyvals too),
/// the last set first (the order the standard asks for MPI_COMM_SELF at MPI_Finalize); the
/// first failing callback's error is returned, after all have run.
pub fn delete_all(obj: usize, attrs: &Attrs) -> Res {
    let list = std::mem::take(&mut *lock(attrs));
    let mut first = Ok(());
    for (k, v) in list.into_iter().rev() {
        if let Some(kv) = entry(k) {
            let r = call_delete(&kv, obj, k, v);
            attach(k, -1);
            if first.is_ok() {
                first = r;
            }
        }
    }
    first
}

/// The attributes a duplicate of `obj` gets: each keyval's copy callback decides (the
/// duplicate, once made, takes them with `attached`).
pub fn copied(obj: usize, attrs: &Attrs) -> Result<Vec<(c_int, usize)>, MpiErr> {
    let list = lock(attrs).clone();
    let mut out = Vec::new();
    for (k, v) in list {
        let Some(kv) = entry(k) else { continue };
        match kv.copy {
            0 => {}
            1 => out.push((k, v)),
            f => {
                // SAFETY: the user's copy function, as the standard specifies it.
                let f: CopyFn = unsafe { std::mem::transmute::<usize, CopyFn>(f) };
                let (mut newv, mut flag): (*mut c_void, c_int) = (std::ptr::null_mut(), 0);
                let rc = unsafe { f(obj, k, kv.extra as *mut c_void, v as *mut c_void, &mut newv as *mut *mut c_void as *mut c_void, &mut flag) };
                if rc != MPI_SUCCESS {
                    return crate::mpi_err!(MPI_ERR_OTHER, "the copy callback of keyval {k} returned {rc}");
                }
                if flag != 0 {
                    out.push((k, newv as usize));
                }
            }
        }
    }
    Ok(out)
}

// ---- datatype attributes: kept here by handle (datatypes have no object of ours to hold them) ----

static TYPE_ATTRS: Mutex<Vec<(MPI_Datatype, std::sync::Arc<Attrs>)>> = Mutex::new(Vec::new());

fn type_attrs(h: MPI_Datatype, make: bool) -> Option<std::sync::Arc<Attrs>> {
    let mut t = lock(&TYPE_ATTRS);
    if let Some((_, a)) = t.iter().find(|(th, _)| *th == h) {
        return Some(a.clone());
    }
    if !make {
        return None;
    }
    let a = std::sync::Arc::new(Mutex::new(Vec::new()));
    t.push((h, a.clone()));
    Some(a)
}

fn check_type(h: MPI_Datatype) -> Res {
    crate::state::check_active()?;
    crate::datatype::resolve_any(h).map(|_| ())
}

pub unsafe fn type_create_keyval(copy: Option<MPI_Type_copy_attr_function>, delete: Option<MPI_Type_delete_attr_function>, k: *mut c_int, extra: *mut c_void) -> Res {
    // MPI_TYPE_NULL_COPY_FN and MPI_TYPE_NULL_DELETE_FN are NULL (0), MPI_TYPE_DUP_FN is 1.
    *crate::api::out(k, "type_keyval")? = create(Kind::Type, copy.map_or(0, |f| f as usize), delete.map_or(0, |f| f as usize), extra);
    Ok(())
}

pub unsafe fn type_free_keyval(k: *mut c_int) -> Res {
    free(Kind::Type, crate::api::out(k, "type_keyval")?)
}

pub unsafe fn type_set_attr(dt: MPI_Datatype, k: c_int, val: *mut c_void) -> Res {
    check_type(dt)?;
    live(Kind::Type, k)?;
    let a = type_attrs(dt, true).expect("made");
    set(Kind::Type, dt, &a, k, val)
}

pub unsafe fn type_get_attr(dt: MPI_Datatype, k: c_int, value: *mut c_void, flag: *mut c_int) -> Res {
    check_type(dt)?;
    let f = crate::api::out(flag, "flag")?;
    live(Kind::Type, k)?;
    match type_attrs(dt, false) {
        Some(a) => get_into(Kind::Type, &a, k, value, f),
        None => {
            *f = 0;
            Ok(())
        }
    }
}

pub unsafe fn type_delete_attr(dt: MPI_Datatype, k: c_int) -> Res {
    check_type(dt)?;
    live(Kind::Type, k)?;
    match type_attrs(dt, false) {
        Some(a) => delete(Kind::Type, dt, &a, k),
        None => crate::mpi_err!(MPI_ERR_KEYVAL, "keyval {k} has no value on this datatype"),
    }
}

/// The attributes MPI_Type_dup gives the new type (before it is made, so a failing copy
/// callback makes no type).
pub fn type_copied(dt: MPI_Datatype) -> Result<Vec<(c_int, usize)>, MpiErr> {
    match type_attrs(dt, false) {
        Some(a) => copied(dt, &a),
        None => Ok(Vec::new()),
    }
}

pub fn type_set_all(dt: MPI_Datatype, list: Vec<(c_int, usize)>) {
    if !list.is_empty() {
        attached(&list);
        *lock(&type_attrs(dt, true).expect("made")) = list;
    }
}

/// MPI_Type_free: the type's attributes are deleted (their callbacks run) and forgotten.
pub fn type_freed(dt: MPI_Datatype) -> Res {
    let a = {
        let mut t = lock(&TYPE_ATTRS);
        t.iter().position(|(th, _)| *th == dt).map(|i| t.swap_remove(i).1)
    };
    match a {
        Some(a) => delete_all(dt, &a),
        None => Ok(()),
    }
}
