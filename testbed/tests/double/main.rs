//! The test bed's own tests: the Codis double replayed against the real Codis recordings (`conformance`), its
//! behaviour beyond them (`behaviour`), its executor's rounds (`rounds`) and the data path through the proxy double
//! (`datapath`). One test binary, one module per subject.

mod behaviour;
mod conformance;
mod datapath;
mod rounds;
