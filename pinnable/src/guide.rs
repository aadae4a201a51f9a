#![doc = include_str!("../guide/index.md")]

macro_rules! chapter {
    ($name:ident, $file:literal) => {
        #[doc = include_str!(concat!("../guide/", $file))]
        pub mod $name {}
    };
}

chapter!(batches, "batches.md");
chapter!(loader, "loader.md");
chapter!(tokens, "tokens.md");
chapter!(images, "images.md");
chapter!(tar, "tar.md");
chapter!(gpus, "gpus.md");
chapter!(resume, "resume.md");
chapter!(errors, "errors.md");
chapter!(safety, "safety.md");
chapter!(performance, "performance.md");
chapter!(integrations, "integrations.md");
