//! The module's entry point and `TOLLGATE.DECIDE` (see the [crate docs](crate)). Not built for
//! the crate's unit tests: `redis_module!` installs Redis's allocator as the global one, which
//! only works inside `redis-server`.

use std::ffi::{CStr, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;

use redis_module::raw::{self, RedisModuleCommandKeySpec as KeySpec};
use redis_module::{Context, RedisError, RedisString, RedisValue, Status, redis_module};

use crate::args::split;
use crate::store::ModuleStore;

/// The command's name as registered (Redis matches command names without regard to case).
const NAME: &CStr = c"tollgate.decide";

/// Decides one call: split, `execute`, the reply.
fn decide(ctx: &Context, args: &[RedisString]) -> Result<RedisValue, RedisError> {
    let bytes: Vec<&[u8]> = args.iter().skip(1).map(RedisString::as_slice).collect();
    let call = split(&bytes).map_err(|e| RedisError::String(e.to_string()))?;
    let mut store = ModuleStore::new(ctx);
    let reply = tollgate_core::script::execute(call.keys, call.argv, &mut store)
        .map_err(|e| RedisError::String(e.to_string()))?;
    Ok(RedisValue::Array(reply.into_iter().map(RedisValue::Integer).collect()))
}

fn tollgate_decide(ctx: &Context, args: Vec<RedisString>) -> Result<RedisValue, RedisError> {
    if ctx.is_keys_position_request() {
        // Redis asks where the keys are (getkeys-api): Redis 7.0 routes a Cluster call, and
        // answers COMMAND GETKEYS, by this rather than by the key specs. A bad numkeys names
        // no key; the call itself then answers the error.
        let bytes: Vec<&[u8]> = args.iter().skip(1).map(RedisString::as_slice).collect();
        if let Ok(call) = split(&bytes) {
            (0..call.keys.len()).filter_map(|i| i32::try_from(i + 2).ok()).for_each(|at| ctx.key_at_pos(at));
        }
        return Ok(RedisValue::NoReply);
    }
    // A panic must not cross into C (that aborts redis-server): it becomes an error reply.
    // `execute` reads every state before writing any, so a panic while deciding leaves the
    // data untouched.
    catch_unwind(AssertUnwindSafe(|| decide(ctx, &args))).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("no message");
        Err(RedisError::String(format!("ERR tollgate: internal error while deciding: {what}")))
    })
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

/// Declares the command's arity, key specs and documentation (`COMMAND INFO`, `COMMAND DOCS`),
/// after `redis_module!` created it. Done by hand: `redis-module`'s own way (its `#[command]`
/// macro) insists on `RedisModule_SetCommandACLCategories`, which Redis 7.0 lacks.
fn declare(ctx: &Context, _args: &[RedisString]) -> Status {
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
        commands: [
            // write: it writes state. deny-oom: a decision that needs memory the server has
            // not got is refused before it starts, never half written. Not fast: a sliding
            // window log reads its whole sorted set (up to its limit). getkeys-api: Redis 7.0
            // finds a call's keys (Cluster routing) by asking the command, not by the key
            // specs; first/last/step 0: the key specs (declare) describe them for 7.2+ and
            // for clients reading COMMAND INFO.
            ["tollgate.decide", tollgate_decide, "write deny-oom getkeys-api", 0, 0, 0, ""],
        ],
    }
}
