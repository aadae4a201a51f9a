//! `Pinnable` and `ToDevice` for tensors, std containers and plain data.
//!
//! Both traits walk values the same way, so one macro writes each impl for both: containers
//! recurse with a path segment per element, plain data is cloned.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Debug;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::Arc;

use crate::error::Result;
use crate::path::Walk;
use crate::pin::{PinContext, Pinnable};
use crate::tensor::Tensor;
use crate::transfer::{MoveContext, ToDevice};

/// Writes `impl Trait for Type` for both traits from one body that uses `$cx` and `$recurse`.
/// The type parameters listed in `each[...]` are bounded by the trait being implemented.
/// `measure` gives `ToDevice::measure_with`'s body (using `$visit`), which walks the parts in
/// the same order without building anything; without it, the trait's default builds and drops.
macro_rules! both {
    (
        impl[$($gen:tt)*] for $ty:ty where [$($bound:tt)*] each [$($p:ident),*];
        |$this:ident, $cx:ident, $recurse:ident| $body:block
        $(measure |$mthis:ident, $mcx:ident, $visit:ident| $mbody:block)?
    ) => {
        impl<$($gen)*> Pinnable for $ty where $($bound)* $($p: Pinnable,)* {
            fn pin_with(&self, $cx: &mut PinContext<'_>) -> Result<Self> {
                #[allow(unused_macros)]
                macro_rules! $recurse {
                    ($v:expr) => { Pinnable::pin_with($v, $cx) };
                    ($v:expr, $c:expr) => { Pinnable::pin_with($v, $c) };
                }
                let $this = self;
                $body
            }
        }
        impl<$($gen)*> ToDevice for $ty where $($bound)* $($p: ToDevice,)* {
            fn to_device_with(&self, $cx: &mut MoveContext<'_>) -> Result<Self> {
                #[allow(unused_macros)]
                macro_rules! $recurse {
                    ($v:expr) => { ToDevice::to_device_with($v, $cx) };
                    ($v:expr, $c:expr) => { ToDevice::to_device_with($v, $c) };
                }
                let $this = self;
                $body
            }
            $(
            fn measure_with(&self, $mcx: &mut MoveContext<'_>) -> Result<()> {
                #[allow(unused_macros)]
                macro_rules! $visit {
                    ($v:expr) => { ToDevice::measure_with($v, $mcx) };
                    ($v:expr, $c:expr) => { ToDevice::measure_with($v, $c) };
                }
                let $mthis = self;
                $mbody
            }
            )?
        }
    };
}

impl Pinnable for Tensor {
    fn pin_with(&self, cx: &mut PinContext<'_>) -> Result<Self> {
        cx.pin_tensor(self)
    }
}

impl ToDevice for Tensor {
    fn to_device_with(&self, cx: &mut MoveContext<'_>) -> Result<Self> {
        cx.move_tensor(self)
    }

    fn measure_with(&self, cx: &mut MoveContext<'_>) -> Result<()> {
        cx.measure_tensor(self)
    }
}

/// Plain data: carried over unchanged.
macro_rules! plain {
    ($($t:ty),* $(,)?) => {$(
        both! {
            impl[] for $t where [] each []; |this, _cx, _r| { Ok(this.clone()) }
            measure |_this, _cx, _v| { Ok(()) }
        }
    )*};
}

plain!(
    bool,
    char,
    String,
    (),
    u8,
    u16,
    u32,
    u64,
    u128,
    usize,
    i8,
    i16,
    i32,
    i64,
    i128,
    isize,
    f32,
    f64,
    half::f16,
    half::bf16,
    &'static str
);

both! {
    impl[T: ?Sized] for PhantomData<T> where [] each []; |_this, _cx, _r| { Ok(PhantomData) }
    measure |_this, _cx, _v| { Ok(()) }
}

both! {
    impl[T] for Option<T> where [] each [T];
    |this, cx, recurse| { match this { Some(v) => Ok(Some(recurse!(v)?)), None => Ok(None) } }
    measure |this, cx, visit| { match this { Some(v) => visit!(v), None => Ok(()) } }
}

both! {
    impl[T] for Box<T> where [] each [T];
    |this, cx, recurse| { Ok(Box::new(recurse!(&**this)?)) }
    measure |this, cx, visit| { visit!(&**this) }
}

both! {
    impl[T] for Arc<T> where [] each [T];
    |this, cx, recurse| { Ok(Arc::new(recurse!(&**this)?)) }
    measure |this, cx, visit| { visit!(&**this) }
}

both! {
    impl[T] for Rc<T> where [] each [T];
    |this, cx, recurse| { Ok(Rc::new(recurse!(&**this)?)) }
    measure |this, cx, visit| { visit!(&**this) }
}

// Sequences are built at their final capacity: collecting through `Result` gives no size
// hint, and growing a batch of a thousand tensors by doubling moved each one ten times.
both! {
    impl[T] for Vec<T> where [] each [T];
    |this, cx, recurse| {
        let mut out = Vec::with_capacity(this.len());
        for (i, v) in this.iter().enumerate() {
            out.push(cx.index(i, |cx| recurse!(v, cx))?);
        }
        Ok(out)
    }
    measure |this, cx, visit| {
        for (i, v) in this.iter().enumerate() {
            cx.index(i, |cx| visit!(v, cx))?;
        }
        Ok(())
    }
}

both! {
    impl[T] for VecDeque<T> where [] each [T];
    |this, cx, recurse| {
        let mut out = VecDeque::with_capacity(this.len());
        for (i, v) in this.iter().enumerate() {
            out.push_back(cx.index(i, |cx| recurse!(v, cx))?);
        }
        Ok(out)
    }
    measure |this, cx, visit| {
        for (i, v) in this.iter().enumerate() {
            cx.index(i, |cx| visit!(v, cx))?;
        }
        Ok(())
    }
}

both! {
    impl[T, const N: usize] for [T; N] where [] each [T];
    |this, cx, recurse| {
        let mut v: Vec<T> = Vec::with_capacity(N);
        for (i, x) in this.iter().enumerate() {
            v.push(cx.index(i, |cx| recurse!(x, cx))?);
        }
        Ok(v.try_into().unwrap_or_else(|_| unreachable!("N elements in, N out")))
    }
    measure |this, cx, visit| {
        for (i, v) in this.iter().enumerate() {
            cx.index(i, |cx| visit!(v, cx))?;
        }
        Ok(())
    }
}

both! {
    impl[K, V, S] for HashMap<K, V, S>
    where [K: Clone + Eq + Hash + Debug, S: BuildHasher + Clone,] each [V];
    |this, cx, recurse| {
        let mut out = HashMap::with_capacity_and_hasher(this.len(), this.hasher().clone());
        for (k, v) in this {
            out.insert(k.clone(), cx.key(k, |cx| recurse!(v, cx))?);
        }
        Ok(out)
    }
    measure |this, cx, visit| {
        for (k, v) in this {
            cx.key(k, |cx| visit!(v, cx))?;
        }
        Ok(())
    }
}

both! {
    impl[K, V] for BTreeMap<K, V> where [K: Clone + Ord + Debug,] each [V];
    |this, cx, recurse| {
        let mut out = BTreeMap::new();
        for (k, v) in this {
            out.insert(k.clone(), cx.key(k, |cx| recurse!(v, cx))?);
        }
        Ok(out)
    }
    measure |this, cx, visit| {
        for (k, v) in this {
            cx.key(k, |cx| visit!(v, cx))?;
        }
        Ok(())
    }
}

macro_rules! tuples {
    ($( ( $($name:ident $idx:tt),+ ) )*) => {$(
        both! {
            impl[$($name),+] for ($($name,)+) where [] each [$($name),+];
            |this, cx, recurse| {
                Ok(($( cx.field(stringify!($idx), |cx| recurse!(&this.$idx, cx))?, )+))
            }
            measure |this, cx, visit| {
                $( cx.field(stringify!($idx), |cx| visit!(&this.$idx, cx))?; )+
                Ok(())
            }
        }
    )*};
}

tuples! {
    (A 0)
    (A 0, B 1)
    (A 0, B 1, C 2)
    (A 0, B 1, C 2, D 3)
    (A 0, B 1, C 2, D 3, E 4)
    (A 0, B 1, C 2, D 3, E 4, F 5)
    (A 0, B 1, C 2, D 3, E 4, F 5, G 6)
    (A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7)
    (A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8)
    (A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9)
    (A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10)
    (A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10, L 11)
}
