//! The module's entry point and `TOLLGATE.DECIDE` (see the [crate docs](crate)). Not built for
//! the crate's unit tests: `redis_module!` installs Redis's allocator as the global one, which
//! only works inside `redis-server`.

use std::ffi::{CStr, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;

use redis_module::raw::{
    self, ModuleOptions, RedisModuleCommandKeySpec as KeySpec, RedisModuleCtx, RedisModuleString,
};
use redis_module::{Context, RedisString, Status, redis_module};
use smallvec::SmallVec;

use crate::args::split;
use crate::store::ModuleStore;

/// The command's name as registered (Redis matches command names without regard to case).
const NAME: &CStr = c"tollgate.decide";

/// The command's flags. write: it writes state. deny-oom: a decision that needs memory the
/// server has not got is refused before it starts, never half written. Not fast: a sliding
/// window log reads its whole sorted set (up to its limit). getkeys-api: Redis 7.0 finds a
/// call's keys (Cluster routing) by asking the command, not by the key specs.
const FLAGS: &CStr = c"write deny-oom getkeys-api";

/// Arguments a call holds on the stack (a batch of more spills to the heap).
type Args<'a> = SmallVec<[&'a [u8]; 32]>;

/// The call's arguments after the command's name, as bytes, read in place (no copy).
fn bytes<'a>(argv: &[*mut RedisModuleString]) -> Args<'a> {
    argv.iter().map(|&arg| RedisString::string_as_slice(arg)).collect()
}

/// Decides one call: split, `execute`, the reply. `argv` are the arguments after the name.
fn decide(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> Result<(), String> {
    let args = bytes(argv);
    let call = split(&args).map_err(|e| e.to_string())?;
    // The keys' strings: the arguments after numkeys.
    let names = &argv[1..1 + call.keys.len()];
    let mut reply: SmallVec<[i64; 36]> = SmallVec::new();
    {
        // Dropped before the reply: each key written is signalled, and every key closed.
        let mut store = ModuleStore::new(ctx, call.keys, names);
        tollgate_core::script::execute_into(call.keys, call.argv, &mut store, &mut reply)
            .map_err(|e| e.to_string())?;
    }
    raw::reply_with_array(ctx, reply.len() as _);
    for value in reply {
        raw::reply_with_long_long(ctx, value);
    }
    Ok(())
}

/// `TOLLGATE.DECIDE`, as Redis calls it: registered by hand ([`declare`]) rather than through
/// `redis_module!`, whose wrapper copies every argument into a `Vec` of retained strings.
extern "C" fn tollgate_decide(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    let argv: &[*mut RedisModuleString] = match usize::try_from(argc) {
        Ok(count) if !argv.is_null() && count > 0 => {
            #[allow(unsafe_code)]
            // SAFETY: Redis passes `argc` valid strings at `argv`, alive for the whole call.
            unsafe {
                std::slice::from_raw_parts(argv, count)
            }
        }
        _ => &[],
    };
    // The arguments after the name (the arity, -2, guarantees one at least).
    let argv = argv.get(1..).unwrap_or_default();
    if context.is_keys_position_request() {
        // Redis asks where the keys are (getkeys-api): Redis 7.0 routes a Cluster call, and
        // answers COMMAND GETKEYS, by this rather than by the key specs. A bad numkeys names
        // no key; the call itself then answers the error.
        if let Ok(call) = split(&bytes(argv)) {
            (0..call.keys.len())
                .filter_map(|i| i32::try_from(i + 2).ok())
                .for_each(|at| context.key_at_pos(at));
        }
        return raw::REDISMODULE_OK as c_int;
    }
    // A panic must not cross into C (that aborts redis-server): it becomes an error reply.
    // `execute` reads every state before writing any, so a panic while deciding leaves the
    // data untouched.
    let outcome = catch_unwind(AssertUnwindSafe(|| decide(ctx, argv))).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("no message");
        Err(format!("ERR tollgate: internal error while deciding: {what}"))
    });
    if let Err(message) = outcome {
        context.reply_error_string(&message);
    }
    raw::REDISMODULE_OK as c_int
}

/// The command's key specs: one spec, whose keys start at argument 1 (numkeys), and number
/// that many, one by one, from the argument after it; then the zeroed entry ending the list.
fn key_specs() -> [KeySpec; 2] {
    let keys = KeySpec {
        notes: c"the parts' state keys, as the script's KEYS".as_ptr(),
        flags: u64::from(
            raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS | raw::REDISMODULE_CMD_KEY_UPDATE,
        ),
        begin_search_type: raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX,
        bs: raw::RedisModuleCommandKeySpec__bindgen_ty_1 {
            index: raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 { pos: 1 },
        },
        find_keys_type: raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM,
        fk: raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
            keynum: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_2 {
                keynumidx: 0,
                firstkey: 1,
                keystep: 1,
            },
        },
    };
    let end = KeySpec {
        notes: ptr::null(),
        flags: 0,
        begin_search_type: raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INVALID,
        bs: raw::RedisModuleCommandKeySpec__bindgen_ty_1 {
            index: raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 { pos: 0 },
        },
        find_keys_type: raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_OMITTED,
        fk: raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
            range: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 {
                lastkey: 0,
                keystep: 0,
                limit: 0,
            },
        },
    };
    [keys, end]
}

/// The version of the command-info structures this crate passes (`REDISMODULE_COMMAND_INFO_VERSION`).
static INFO_VERSION: raw::RedisModuleCommandInfoVersion = raw::RedisModuleCommandInfoVersion {
    version: 1,
    sizeof_historyentry: size_of::<raw::RedisModuleCommandHistoryEntry>(),
    sizeof_keyspec: size_of::<KeySpec>(),
    sizeof_arg: size_of::<raw::RedisModuleCommandArg>(),
};

/// Creates the command, and declares its arity, key specs and documentation (`COMMAND INFO`,
/// `COMMAND DOCS`). Done by hand: `redis-module`'s own way (its `#[command]` macro) insists on
/// `RedisModule_SetCommandACLCategories`, which Redis 7.0 lacks, and its `commands` list wraps
/// the handler in a copy of every argument. First/last/step 0: the key specs describe the keys
/// for 7.2+ and for clients reading COMMAND INFO; 7.0 asks the command (getkeys-api).
fn declare(ctx: &Context, _args: &[RedisString]) -> Status {
    // The store signals the keys it wrote itself; closing a key opened for writing would
    // otherwise signal it, written or not (a denied check would abort a WATCHed transaction).
    ctx.set_module_options(ModuleOptions::NO_IMPLICIT_SIGNAL_MODIFIED);
    let create = api!(RedisModule_CreateCommand);
    #[allow(unsafe_code)]
    // SAFETY: `ctx` is the load context; the name and flags are NUL-terminated static strings,
    // which CreateCommand copies; the handler is an `extern "C"` function of the signature
    // Redis calls.
    let created =
        unsafe { create(ctx.get_raw(), NAME.as_ptr(), Some(tollgate_decide), FLAGS.as_ptr(), 0, 0, 0) };
    if created != raw::REDISMODULE_OK as c_int {
        ctx.log_warning("tollgate: could not create TOLLGATE.DECIDE");
        return Status::Err;
    }
    let (Some(get_command), Some(set_info)) = (
        {
            #[allow(unsafe_code)]
            // SAFETY: RedisModule_Init has filled the API table (this runs in OnLoad after it);
            // reading a function pointer copies it.
            unsafe {
                raw::RedisModule_GetCommand
            }
        },
        {
            #[allow(unsafe_code)]
            // SAFETY: as above.
            unsafe {
                raw::RedisModule_SetCommandInfo
            }
        },
    ) else {
        ctx.log_warning("tollgate: this Redis has no command info API (Redis 7.0 or later is needed)");
        return Status::Err;
    };
    // Redis copies what it keeps (RM_SetCommandInfo duplicates the notes and specs).
    let mut specs = key_specs();
    let info = raw::RedisModuleCommandInfo {
        version: &INFO_VERSION,
        summary: c"Decides a batch of rate-limit operations: Tollgate's script, run by its Rust engine"
            .as_ptr(),
        complexity: c"O(N) in the parts and rules; a sliding window log reads its sorted set".as_ptr(),
        since: c"0.1.0".as_ptr(),
        history: ptr::null_mut(),
        tips: ptr::null(),
        arity: -2,
        key_specs: specs.as_mut_ptr(),
        args: ptr::null_mut(),
    };
    #[allow(unsafe_code)]
    // SAFETY: `ctx` is the load context, `NAME` a NUL-terminated command name this module
    // created; `info` and everything it points to (static strings, `specs` ended by a zeroed
    // entry, the static version) outlive the calls, and SetCommandInfo reads only the fields
    // the version's sizes describe, copying what it keeps.
    let status = unsafe {
        let command = get_command(ctx.get_raw(), NAME.as_ptr());
        if command.is_null() { raw::REDISMODULE_ERR as c_int } else { set_info(command, &info) }
    };
    if status == raw::REDISMODULE_OK as c_int {
        Status::Ok
    } else {
        ctx.log_warning("tollgate: could not declare TOLLGATE.DECIDE's key specs");
        Status::Err
    }
}

// The macro generates the C entry points (`#[no_mangle]` functions, calls through the module
// API's pointers), which the `unsafe_code` lint counts as unsafe; their soundness is the
// `redis-module` crate's.
#[allow(unsafe_code)]
mod entry {
    use super::*;

    redis_module! {
        name: crate::NAME,
        version: crate::VERSION,
        // Redis's allocator, so that the module's memory counts in INFO memory and maxmemory.
        allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
        data_types: [],
        init: declare,
        commands: [],
    }
}
