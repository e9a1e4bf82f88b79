//! Link settings of the binary.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // Relative relocations packed (DT_RELR): at every start the loader reads a few KiB instead of the ~650 KiB of
    // `.rela.dyn` a position-independent binary of this size carries, which role-probe pays every few seconds in
    // every pod. glibc 2.36+ and binutils 2.38+ know the format; other targets (the musl image) keep the default.
    let gnu_linux = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    if gnu_linux {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
