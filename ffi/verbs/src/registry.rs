//! Service handle → application pointer, for the objects async events name (QP by QPN, CQ
//! and SRQ by service handle). Control path only (a mutex).
use std::collections::HashMap;
use std::sync::Mutex;

/// Kinds of objects events refer to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Qp,
    Cq,
    Srq,
}

static OBJECTS: Mutex<Option<HashMap<(Kind, u32), usize>>> = Mutex::new(None);

/// Remember `ptr` (the C pointer handed to the application) for `(kind, id)`.
pub fn insert<T>(kind: Kind, id: u32, ptr: *mut T) {
    OBJECTS.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(HashMap::new).insert((kind, id), ptr as usize);
}

/// Forget `(kind, id)` (before the object is freed).
pub fn remove(kind: Kind, id: u32) {
    if let Some(m) = OBJECTS.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        m.remove(&(kind, id));
    }
}

/// The application pointer for `(kind, id)`, if the object is alive.
pub fn get<T>(kind: Kind, id: u32) -> Option<*mut T> {
    OBJECTS.lock().unwrap_or_else(|e| e.into_inner()).as_ref()?.get(&(kind, id)).map(|p| *p as *mut T)
}
