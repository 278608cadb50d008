// SPDX-License-Identifier: MIT
pragma solidity 0.8.37;

// A minimal smart-contract wallet for the devnet, written by x402-fleet from ERC-1271 and ERC-6492:
// one owner key; a signature is valid for the wallet when the owner signed the hash itself (ECDSA,
// low s). The factory deploys wallets with CREATE2, so a wallet's address is known before it exists
// and a payer can sign as it (ERC-6492 wraps such a signature with the factory call that deploys it).

contract DevnetSmartWallet {
    bytes4 private constant ERC1271_MAGIC_VALUE = 0x1626ba7e;
    bytes4 private constant ERC1271_INVALID = 0xffffffff;
    uint256 private constant HALF_ORDER = 0x7fffffffffffffffffffffffffffffff5d576e7357a4501ddfe92f46681b20a0;

    struct Call {
        address to;
        bytes data;
    }

    address public immutable owner;
    /// The factory that created it: the only caller of `initialize`, once.
    address private immutable creator;
    bool private initialized;

    error NotOwner(address caller);
    error CallFailed(bytes returned);
    error AlreadyInitialized();

    constructor(address owner_) {
        owner = owner_;
        creator = msg.sender;
    }

    /// The wallet's creation calls (an ERC-20 approval of Permit2, say), run by its factory as it
    /// deploys it; the wallet's address commits to them (see createWalletWithCalls).
    function initialize(Call[] calldata calls) external {
        if (msg.sender != creator || initialized) revert AlreadyInitialized();
        initialized = true;
        for (uint256 i = 0; i < calls.length; ++i) {
            (bool ok, bytes memory returned) = calls[i].to.call(calls[i].data);
            if (!ok) revert CallFailed(returned);
        }
    }

    function isValidSignature(bytes32 hash, bytes calldata signature) external view returns (bytes4) {
        if (signature.length != 65) return ERC1271_INVALID;
        bytes32 r = bytes32(signature[0:32]);
        bytes32 s = bytes32(signature[32:64]);
        uint8 v = uint8(signature[64]);
        if (uint256(s) > HALF_ORDER || (v != 27 && v != 28)) return ERC1271_INVALID;
        address signer = ecrecover(hash, v, r, s);
        return signer != address(0) && signer == owner ? ERC1271_MAGIC_VALUE : ERC1271_INVALID;
    }

    /// The owner acts as the wallet (an ERC-20 approval of Permit2, say).
    function execute(address to, uint256 value, bytes calldata data) external returns (bytes memory) {
        if (msg.sender != owner) revert NotOwner(msg.sender);
        (bool ok, bytes memory returned) = to.call{value: value}(data);
        if (!ok) revert CallFailed(returned);
        return returned;
    }

    receive() external payable {}
}

contract DevnetSmartWalletFactory {
    event WalletCreated(address indexed wallet, address indexed owner, bytes32 salt);

    /// Deploys the owner's wallet for `salt`, or returns it when it exists (a repeated deployment is harmless).
    function createWallet(address owner, bytes32 salt) external returns (address wallet) {
        wallet = walletAddress(owner, salt);
        if (wallet.code.length > 0) return wallet;
        DevnetSmartWallet created = new DevnetSmartWallet{salt: salt}(owner);
        emit WalletCreated(address(created), owner, salt);
        return address(created);
    }

    /// Deploys the owner's wallet and runs its creation calls. The CREATE2 salt commits to the calls,
    /// so nobody can deploy the same address with other calls.
    function createWalletWithCalls(address owner, bytes32 salt, DevnetSmartWallet.Call[] calldata calls) external returns (address wallet) {
        bytes32 committed = keccak256(abi.encode(salt, calls));
        wallet = walletAddress(owner, committed);
        if (wallet.code.length > 0) return wallet;
        DevnetSmartWallet created = new DevnetSmartWallet{salt: committed}(owner);
        created.initialize(calls);
        emit WalletCreated(address(created), owner, committed);
        return address(created);
    }

    function walletAddress(address owner, bytes32 salt) public view returns (address) {
        bytes32 initCodeHash = keccak256(abi.encodePacked(type(DevnetSmartWallet).creationCode, abi.encode(owner)));
        return address(uint160(uint256(keccak256(abi.encodePacked(bytes1(0xff), address(this), salt, initCodeHash)))));
    }
}
